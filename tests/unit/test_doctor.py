"""The doctor's config-level checks: for each, a draft built here that passes and one that fails, message asserted;
the numbering table by framework, version and model class; bad inputs exit 2 naming the file. The target's facts come
from the tiny models' real config.json and from run manifests written by the real manifest writer."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline import doctor
from pipeline.drafts.examine import Request, examine
from pipeline.drafts.load import check_weights
from pipeline.points import numbering_for
from pipeline.shards import layout
from pipeline.shards.manifest import write_manifest
from tests.helpers.drafts import make_draft
from tests.helpers.markers import needs_sglang

SGLANG_ARGS = "--speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1 " \
              "--speculative-num-draft-tokens 4"


@pytest.fixture(scope="module")
def llama(models_root) -> dict:
    return json.loads((models_root / "tiny-llama" / "config.json").read_text())


@pytest.fixture(scope="module")
def kimi(models_root) -> dict:
    return json.loads((models_root / "tiny-kimi-bf16" / "config.json").read_text())


def run_dir(path: Path, *, points, model_type="llama", architecture="LlamaForCausalLM", num_layers=6, hidden=256,
            engine=None, diff=None, model_path=None) -> Path:
    """A finished run's manifest as extract writes it (the doctor reads nothing else of a run)."""
    path.mkdir(parents=True, exist_ok=True)
    engine = engine or {"framework": "transformers", "framework_version": "5.19.0", "dtype": "bfloat16",
                        "attention_backend": "sdpa", "quantization": {"kernel": "dense"}}
    write_manifest(path, {
        "format_version": layout.FORMAT_VERSION, "points": points, "hidden_size": hidden, "dtype": "bfloat16",
        "shards": [], "num_samples": 0, "num_tokens": 0, "num_loss_tokens": 0,
        "storage": {"dtype": "bfloat16", "capture_dtype": "bfloat16", "scaling": "none"},
        "provenance": {"engine": engine, "diff": diff, "model": {
            "model_type": model_type, "architecture": architecture, "num_layers": num_layers, "hidden_size": hidden,
            "path": str(model_path) if model_path else None}}})
    return path


def export_dir(path: Path, *, fmt, aux, last, run_points, model_type="llama", num_layers=6, hidden=256,
               derived=False) -> Path:
    """An export's sidecar as pipeline.exports.sidecar writes it (the fields the doctor reads)."""
    path.mkdir(parents=True, exist_ok=True)
    slots = [{"slot": i, "role": "aux", "point": p} for i, p in enumerate(aux)]
    slots.append({"slot": len(aux), "role": "last", "point": last})
    (path / "export.json").write_text(json.dumps({
        "format": fmt, "slots": slots, "run_points": run_points, "hidden_size": hidden,
        "last_state": {"point": last, "derived": derived},
        "model": {"model_type": model_type, "num_layers": num_layers}, "run_dir": str(path / "gone")}))
    return path


def findings(draft, serve="sglang", **kw):
    found, _ = examine(Request(draft=draft, serve=serve, **kw))
    return found


def only(found, check):
    return [f for f in found if f.check == check]


def status(found, check):
    return {f.status for f in only(found, check)}


def text(found, check):
    return " | ".join(f.message for f in only(found, check))


# --- numbering: one table, by framework, version and model class ---------------------------------------------------

@pytest.mark.parametrize("framework,model_type,architecture,convention", [
    ("sglang", "llama", "LlamaForCausalLM", "sglang-llama"),
    ("sglang", "deepseek_v3", "DeepseekV3ForCausalLM", "sglang-deepseek"),
    ("sglang", "kimi_k25", "KimiK25ForConditionalGeneration", "sglang-deepseek"),
    ("vllm", "llama", "LlamaForCausalLM", "vllm"),
    ("vllm", "deepseek_v3", "DeepseekV3ForCausalLM", "vllm"),
    ("vllm", "kimi_k25", "KimiK25ForConditionalGeneration", "vllm"),
    ("speculators", "llama", None, "speculators-0.9"),
])
def test_numbering_by_framework_and_model_class(framework, model_type, architecture, convention):
    row, known = numbering_for(framework, model_type=model_type, architecture=architecture,
                               version={"sglang": "0.5.23", "vllm": "0.32.0", "speculators": "0.9.0"}[framework])
    assert row.convention == convention and known
    if architecture == "KimiK25ForConditionalGeneration":
        assert "delegates to language_model" in row.source


def test_an_unread_version_uses_the_nearest_row_and_says_so(tmp_path, llama, models_root):
    row, known = numbering_for("sglang", model_type="llama", version="0.6.1")
    assert row.versions == ("0.5.23",) and not known
    draft = make_draft(tmp_path / "d", llama, aux_ids=[0, 2, 4])
    found = findings(draft, target=models_root / "tiny-llama", serve_version="0.6.1")
    assert status(found, "numbering") == {"WARN"} and "no numbering read from this version" in text(found, "numbering")


# --- aux ids --------------------------------------------------------------------------------------------------------

def test_aux_ids_translated_with_the_servers_numbering(tmp_path, llama):
    run = run_dir(tmp_path / "run", points=["b1", "b3", "b5", "b6", "final_norm"])
    good = make_draft(tmp_path / "good", llama, aux_ids=[0, 2, 4])  # SGLang Llama: id k = boundary k+1
    found = findings(good, run=run)
    assert status(found, "aux-ids") == {"OK"} and "captures b1,b3,b5" in text(found, "aux-ids")
    bad = make_draft(tmp_path / "bad", llama, aux_ids=[1, 3, 5])  # vLLM's ids for b1,b3,b5, served by SGLang
    found = findings(bad, run=run, target=None)
    assert status(found, "aux-ids") == {"MISMATCH"}
    assert "sglang-llama id 5 is out of range" in text(found, "aux-ids")
    found = findings(bad, serve="vllm", run=run)
    assert status(found, "aux-ids") == {"OK"}


def test_deepseek_first_id_one_moves_the_list(tmp_path, kimi):
    points = ["b0", "b1", "b3", "b6", "b8", "final_norm"]
    exp = export_dir(tmp_path / "exp", fmt="specforge", aux=["b1", "b3", "b6"], last="final_norm", run_points=points,
                     model_type="deepseek_v3", num_layers=8)
    draft = make_draft(tmp_path / "d", kimi, schema="mla", aux_ids=[1, 3, 6])
    found = findings(draft, export=exp)
    assert status(found, "aux-ids") == {"MISMATCH"}
    msg = text(found, "aux-ids")
    assert "will feed b2,b4,b7" in msg and "trained on b1,b3,b6" in msg and "all +1 when the first id is 1" in msg
    assert "cannot be the first aux point" in msg  # no SGLang ids select b1,b3,b6 at all
    assert status(findings(draft, serve="vllm", export=exp), "aux-ids") == {"OK"}
    refused = make_draft(tmp_path / "r", kimi, schema="mla", aux_ids=[1, 4, 7])  # b8 = bN: SGLang cannot capture it
    assert "sglang-deepseek id 7 is out of range" in text(findings(refused, export=exp), "aux-ids")


def test_the_kimi_k25_wrapper_target_numbers_through_its_language_model(tmp_path, kimi):
    """--target on a Kimi-K2.5 wrapper checkpoint: text facts from text_config, the numbering by the wrapper class."""
    wrapper = tmp_path / "k25"
    wrapper.mkdir()
    (wrapper / "config.json").write_text(json.dumps({
        "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
        "text_config": {**kimi, "model_type": "kimi_k2"}, "vision_config": {"vt_hidden_size": 32}}))
    draft = make_draft(tmp_path / "d", kimi, schema="mla", aux_ids=[1, 3, 5])
    found, context = examine(Request(draft=draft, serve="sglang", target=wrapper))
    assert context["target"] == {"model_type": "kimi_k25", "architecture": "KimiK25ForConditionalGeneration",
                                 "num_layers": 8, "hidden_size": 256, "vocab_size": 4096,
                                 "sources": [f"target {wrapper}"]}
    msg = text(found, "aux-ids")
    assert "will capture b2,b4,b6" in msg and "KimiK25ForConditionalGeneration.set_eagle3_layers_to_capture" in msg
    found, _ = examine(Request(draft=draft, serve="vllm", target=wrapper))
    assert "will capture b1,b3,b5" in text(found, "aux-ids")


def test_sglang_ignores_top_level_ids_and_captures_its_defaults(tmp_path, llama, models_root):
    run = run_dir(tmp_path / "run", points=["b1", "b3", "b5", "b6", "final_norm"])
    draft = make_draft(tmp_path / "d", llama, aux_ids=[0, 2, 4], ids_at="top")
    found = findings(draft, run=run)
    assert status(found, "aux-ids") == {"MISMATCH"}
    msg = text(found, "aux-ids")
    assert "will feed b2,b3,b3 (its default boundaries (2, N//2, N-3)" in msg and "ignores the top-level" in msg
    assert "set eagle_config.eagle_aux_hidden_state_layer_ids to [0, 2, 4]" in msg
    assert status(findings(draft, serve="vllm", run=run), "aux-ids") == {"MISMATCH"}  # vLLM: top-level [0,2,4] = b0..


# --- aux capture and fc width ---------------------------------------------------------------------------------------

def test_aux_capture_off_feeds_h_wide_state(tmp_path, llama, models_root):
    on = make_draft(tmp_path / "on", llama, aux_ids=[0, 2, 4])
    assert status(findings(on, target=models_root / "tiny-llama"), "aux-capture") == {"OK"}
    off = make_draft(tmp_path / "off", llama, aux_ids=[0, 2, 4], use_aux=False)
    found = findings(off, target=models_root / "tiny-llama")
    assert status(found, "aux-capture") == {"MISMATCH"}
    assert "256-wide post-norm last state" in text(found, "aux-capture")


def test_aux_capture_off_in_a_speculators_config_is_read_where_vllm_reads_it(tmp_path, llama, models_root):
    """vLLM builds a speculators draft from transformer_layer_config: the switch nested there turns capture off (the
    bench measured it), a top-level eagle_config never reaches the server."""
    target = models_root / "tiny-llama"
    off = make_draft(tmp_path / "off", llama, schema="speculators", aux_ids=[1, 3, 5], use_aux=False)
    found = findings(off, serve="vllm", target=target)
    assert status(found, "aux-capture") == {"MISMATCH"}
    assert "transformer_layer_config.eagle_config.use_aux_hidden_state is false" in text(found, "aux-capture")
    on = make_draft(tmp_path / "on", llama, schema="speculators", aux_ids=[1, 3, 5], use_aux=True)
    assert status(findings(on, serve="vllm", target=target), "aux-capture") == {"OK"}
    top = make_draft(tmp_path / "top", llama, schema="speculators", aux_ids=[1, 3, 5],
                     config_extra={"eagle_config": {"use_aux_hidden_state": False}})
    found = findings(top, serve="vllm", target=target)
    assert status(found, "aux-capture") == {"OK"}
    assert "transformer_layer_config.eagle_config.use_aux_hidden_state absent or true" in text(found, "aux-capture")


def test_sglang_cannot_read_a_speculators_config(tmp_path, llama, models_root):
    draft = make_draft(tmp_path / "d", llama, schema="speculators", aux_ids=[1, 3, 5])
    found = findings(draft, target=models_root / "tiny-llama")
    assert status(found, "aux-capture") == {"MISMATCH"} and "no reader" in text(found, "aux-capture")
    assert status(findings(draft, serve="vllm", target=models_root / "tiny-llama"), "aux-capture") == {"OK"}


def test_fc_width_against_aux_count_times_hidden(tmp_path, llama, models_root):
    good = make_draft(tmp_path / "good", llama, aux_ids=[0, 2, 4])
    assert status(findings(good, target=models_root / "tiny-llama"), "fc-width") == {"OK"}
    bad = make_draft(tmp_path / "bad", llama, aux_ids=[0, 2, 4], num_fc_aux=4)
    found = findings(bad, target=models_root / "tiny-llama")
    assert status(found, "fc-width") == {"MISMATCH"}
    assert "builds fc for 3 x 256 = 768 inputs" in text(found, "fc-width")
    assert "feeds 3 aux states x 256 = 768 values per token but fc.weight takes 1024" in text(found, "fc-width")


def test_speculators_draft_with_four_ids_on_vllm(tmp_path, llama, models_root):
    # vLLM captures the 4 top-level ids, but sizes a converted speculators draft's fc for 3
    draft = make_draft(tmp_path / "d", llama, schema="speculators", aux_ids=[1, 2, 3, 5])
    found = findings(draft, serve="vllm", target=models_root / "tiny-llama")
    assert status(found, "fc-width") == {"MISMATCH"} and "builds fc for 3 x 256" in text(found, "fc-width")


# --- sizes, vocabularies, d2t ---------------------------------------------------------------------------------------

def test_hidden_size(tmp_path, llama, models_root):
    good = make_draft(tmp_path / "good", llama)
    assert status(findings(good, target=models_root / "tiny-llama"), "hidden-size") == {"OK"}
    bad = make_draft(tmp_path / "bad", llama, target_hidden_size=512)
    found = findings(bad, target=models_root / "tiny-llama")
    assert status(found, "hidden-size") == {"MISMATCH"}
    assert "reads aux states 512 wide (target_hidden_size) but the target's hidden size is 256" in \
        text(found, "hidden-size")


def test_vocab(tmp_path, llama, models_root):
    good = make_draft(tmp_path / "good", llama, draft_vocab=1024)
    assert status(findings(good, target=models_root / "tiny-llama"), "vocab") == {"OK"}
    bad = make_draft(tmp_path / "bad", llama, vocab_size=8192, draft_vocab=1024)
    found = findings(bad, target=models_root / "tiny-llama")
    assert status(found, "vocab") == {"MISMATCH"}
    assert "vocab_size is 8192 but the target's is 4096" in text(found, "vocab")


@pytest.mark.parametrize("mode,t2d,ok,needle", [
    ("offsets", True, True, "holds offsets"),
    ("offsets", False, True, "no t2d to cross-check"),
    ("absolute", True, False, "holds absolute target ids"),
    ("absolute", False, False, "holds absolute target ids"),
    ("none", False, False, "but no d2t"),
])
def test_d2t_offsets_or_absolute(tmp_path, llama, models_root, mode, t2d, ok, needle):
    draft = make_draft(tmp_path / "d", llama, draft_vocab=1024, d2t=mode, t2d=t2d)
    found = findings(draft, target=models_root / "tiny-llama")
    assert status(found, "d2t") == ({"OK"} if ok else {"MISMATCH"}) and needle in text(found, "d2t")


# --- final norm convention of the trainer's format against the shards -----------------------------------------------

def test_final_norm_of_the_trainer_against_the_export(tmp_path, llama):
    spec = make_draft(tmp_path / "spec", llama, schema="speculators", aux_ids=[1, 3, 5])
    good = export_dir(tmp_path / "e1", fmt="speculators", aux=["b1", "b3", "b5"], last="b6",
                      run_points=["b1", "b3", "b5", "b6", "final_norm"])
    assert status(findings(spec, serve="vllm", export=good), "final-norm") == {"OK"}
    wrong = export_dir(tmp_path / "e2", fmt="specforge", aux=["b1", "b3", "b5"], last="final_norm",
                       run_points=["b1", "b3", "b5", "b6", "final_norm"])
    found = findings(spec, serve="vllm", export=wrong)
    assert status(found, "final-norm") == {"MISMATCH"}
    assert "export the run with --format speculators" in text(found, "final-norm")
    no_last = run_dir(tmp_path / "run", points=["b1", "b3", "b5", "final_norm"])
    found = findings(spec, serve="vllm", run=no_last)
    assert status(found, "final-norm") == {"MISMATCH"} and "holds no b6" in text(found, "final-norm")


def test_final_norm_divided_by_the_norm_weight_is_what_speculators_reads_back(tmp_path, llama):
    """`pipeline.export --last final_norm` (a run without bN): OK for a speculators draft; the same slot not marked
    derived is a post-norm state the trainer normalises again; a SpecForge draft is told to use its own layout."""
    spec = make_draft(tmp_path / "spec", llama, schema="speculators", aux_ids=[1, 3, 5])
    points = ["b1", "b3", "b5", "final_norm"]
    unnormed = export_dir(tmp_path / "e1", fmt="speculators", aux=["b1", "b3", "b5"], last="final_norm",
                          run_points=points, derived=True)
    found = findings(spec, serve="vllm", export=unnormed)
    assert status(found, "final-norm") == {"OK"} and "divided by the final-norm weight" in text(found, "final-norm")
    post_norm = export_dir(tmp_path / "e2", fmt="speculators", aux=["b1", "b3", "b5"], last="final_norm",
                           run_points=points)
    found = findings(spec, serve="vllm", export=post_norm)
    assert status(found, "final-norm") == {"MISMATCH"} and "the norm is applied twice" in text(found, "final-norm")
    forge = make_draft(tmp_path / "forge", llama, schema="specforge", aux_ids=[1, 3, 5])
    found = findings(forge, serve="vllm", export=unnormed)
    assert status(found, "final-norm") == {"MISMATCH"} and "--format specforge" in text(found, "final-norm")


@pytest.mark.parametrize("value,ok,needle", [
    (None, True, "no norm_output"), (True, False, "remove norm_output"), (False, False, "retrain")])
def test_specforge_norm_output_means_another_thing_to_the_servers(tmp_path, llama, models_root, value, ok, needle):
    extra = {} if value is None else {"norm_output": value}
    draft = make_draft(tmp_path / "d", llama, config_extra=extra)
    found = findings(draft, target=models_root / "tiny-llama")
    assert status(found, "draft-norm") == ({"OK"} if ok else {"MISMATCH"}) and needle in text(found, "draft-norm")


@pytest.mark.parametrize("value,nested,shown,where", [
    (True, False, "norm_output true", "transformer_layer_config.norm_output false is read by neither"),
    (None, True, "norm_output absent (false)", "transformer_layer_config.norm_output true is read by neither"),
    (False, None, "norm_output false", "top level, where speculators and vLLM read it")])
def test_speculators_norm_output_is_read_at_the_top_level(tmp_path, llama, models_root, value, nested, shown, where):
    draft = make_draft(tmp_path / "d", llama, schema="speculators", config_extra={} if value is None else
                       {"norm_output": value})
    if nested is not None:  # the nested layer config's key, which speculators and vLLM's converter never read
        config = json.loads((draft / "config.json").read_text())
        config["transformer_layer_config"]["norm_output"] = nested
        (draft / "config.json").write_text(json.dumps(config))
    found = findings(draft, serve="vllm", target=models_root / "tiny-llama")
    assert status(found, "draft-norm") == {"OK"}
    assert shown in text(found, "draft-norm") and where in text(found, "draft-norm")


def test_specforge_norm_output_is_read_at_the_top_level(tmp_path, llama, models_root):
    draft = make_draft(tmp_path / "d", llama, config_extra={"norm_output": True})
    found = findings(draft, serve="vllm", target=models_root / "tiny-llama")
    assert status(found, "draft-norm") == {"MISMATCH"} and "config.json sets norm_output true" in \
        text(found, "draft-norm")


# --- norm_before_residual: SGLang ignores it, vLLM honours it ------------------------------------------------------

@pytest.mark.parametrize("schema,value,serve,ok,needle", [
    # speculators trains with the top-level key (its CLI default true): SGLang ignores it, even converted to its layout
    ("speculators", True, "sglang", False, "sglang 0.5.23 ignores norm_before_residual"),
    ("specforge", True, "sglang", False, "serve it with vLLM (0.32 honours the key) or retrain"),
    ("speculators", True, "vllm", True, "honours config.json norm_before_residual"),
    ("specforge", True, "vllm", True, "norm before residual (true), what the drafter was trained with"),
    ("speculators", False, "sglang", True, "norm after residual (false), what the drafter was trained with"),
    ("specforge", None, "sglang", True, "SpecForge 0.2.0 never applies it"),
    ("specforge", None, "vllm", True, "reads no norm_before_residual, so applies false"),
    # an absent key: speculators' config class means false, vLLM's converter applies true
    ("speculators", None, "vllm", False, "set norm_before_residual to false in config.json")])
def test_norm_before_residual_against_what_the_server_applies(tmp_path, llama, models_root, schema, value, serve, ok,
                                                              needle):
    draft = make_draft(tmp_path / "d", llama, schema=schema, config_extra={} if value is None else
                       {"norm_before_residual": value})
    if value is None and schema == "speculators":  # make_draft writes true, as speculators' CLI does
        config = json.loads((draft / "config.json").read_text())
        del config["norm_before_residual"]
        (draft / "config.json").write_text(json.dumps(config))
    found = findings(draft, serve=serve, target=models_root / "tiny-llama")
    assert status(found, "norm-before-residual") == ({"OK"} if ok else {"MISMATCH"})
    assert needle in text(found, "norm-before-residual"), text(found, "norm-before-residual")


def test_norm_before_residual_on_an_unread_version_says_so(tmp_path, llama, models_root):
    draft = make_draft(tmp_path / "d", llama, config_extra={"norm_before_residual": True})
    found = findings(draft, serve="sglang", serve_version="0.6.0", target=models_root / "tiny-llama")
    assert status(found, "norm-before-residual") == {"WARN", "MISMATCH"}
    assert "was not read from this version's source; using 0.5.23's" in text(found, "norm-before-residual")


# --- flags ----------------------------------------------------------------------------------------------------------

def test_sglang_flags_that_override_each_other(tmp_path, llama, models_root):
    draft = make_draft(tmp_path / "d", llama)
    target = models_root / "tiny-llama"
    assert status(findings(draft, target=target, server_args=SGLANG_ARGS), "flags") == {"OK"}
    found = findings(draft, target=target, server_args=SGLANG_ARGS.replace("draft-tokens 4", "draft-tokens 8"))
    assert status(found, "flags") == {"MISMATCH"}
    assert "--speculative-num-draft-tokens 8 is replaced by 4" in text(found, "flags")
    found = findings(draft, target=target, server_args="--speculative-algorithm EAGLE --speculative-eagle-topk 4")
    assert "only EAGLE3 switches aux capture on" in text(found, "flags")
    assert "without --speculative-num-steps" in text(found, "flags")


def test_vllm_speculative_config(tmp_path, llama, models_root):
    draft = make_draft(tmp_path / "d", llama)
    target = models_root / "tiny-llama"
    good = f"--speculative-config '{{\"method\": \"eagle3\", \"model\": \"{draft}\", \"num_speculative_tokens\": 3}}'"
    assert status(findings(draft, serve="vllm", target=target, server_args=good), "flags") == {"OK"}
    found = findings(draft, serve="vllm", target=target,
                     server_args=f"--speculative-config '{{\"model\": \"{draft}\"}}' --num-speculative-tokens 3")
    msg = text(found, "flags")
    assert "does not contain 'eagle3'" in msg and "no num_speculative_tokens" in msg
    assert "--num-speculative-tokens is not a vLLM 0.32 flag" in msg
    found = findings(draft, serve="vllm", target=target, server_args="--speculative-config {method: eagle3}")
    assert "is not JSON" in text(found, "flags")


# --- kernels --------------------------------------------------------------------------------------------------------

def test_capture_kernels_against_serving_with_diff_figures(tmp_path, llama):
    draft = make_draft(tmp_path / "d", llama, aux_ids=[0, 2, 4])
    sglang = {"framework": "sglang", "framework_version": "0.5.23", "dtype": "bfloat16",
              "attention_backend": "torch_native", "quantization": {"kernel": "dense"}}
    same = run_dir(tmp_path / "same", points=["b1", "b3", "b5", "final_norm"], engine=sglang)
    assert status(findings(draft, run=same), "kernels") == {"OK"}
    diff = {"status": "pass", "pairs": {"hf@bfloat16 vs hf@float32": {"status": "pass", "worst_rel_l2": 0.0123,
                                                                      "top1": 0.98, "kl": 0.002}}}
    other = run_dir(tmp_path / "other", points=["b1", "b3", "b5", "final_norm"], diff=diff)
    found = findings(draft, run=other, server_args=SGLANG_ARGS + " --attention-backend flashinfer")
    assert status(found, "kernels") == {"WARN"}
    msg = text(found, "kernels")
    assert "attention sdpa" in msg and "attention flashinfer" in msg and "worst rel L2 0.0123" in msg


# --- the CLI: lines, JSON, exit status, bad inputs ------------------------------------------------------------------

def test_cli_lines_summary_and_exit_status(tmp_path, llama, models_root, capsys):
    run = run_dir(tmp_path / "run", points=["b1", "b3", "b5", "b6", "final_norm"],
                  model_path=models_root / "tiny-llama")
    draft = make_draft(tmp_path / "d", llama, aux_ids=[0, 2, 4], draft_vocab=1024)
    assert doctor.main(["--draft", str(draft), "--serve", "sglang", "--run", str(run), "--no-load",
                        "--server-args", SGLANG_ARGS + " --attention-backend sdpa"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert all(line.split()[0] in ("OK", "WARN") for line in lines[:-1]) and lines[-1].startswith("SUMMARY")
    assert doctor.main(["--draft", str(draft), "--serve", "vllm", "--run", str(run), "--no-load", "--json"]) == 3
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["counts"]["MISMATCH"] >= 1
    assert {c["check"] for c in report["checks"]} >= {"aux-ids", "fc-width", "d2t", "vocab", "final-norm"}
    assert report["target"]["vocab_size"] == 4096  # read from the run's model directory


def _usage(capsys, *argv) -> str:
    assert doctor.main(list(argv)) == 2
    return capsys.readouterr().err


def test_bad_inputs_are_named_with_exit_2(tmp_path, llama, models_root, capsys):
    target = str(models_root / "tiny-llama")
    assert "config.json does not exist" in _usage(capsys, "--draft", str(tmp_path), "--serve", "sglang",
                                                  "--target", target, "--no-load")
    (tmp_path / "notjson").mkdir()
    (tmp_path / "notjson" / "config.json").write_text("{not json")
    err = _usage(capsys, "--draft", str(tmp_path / "notjson"), "--serve", "sglang", "--target", target)
    assert "notjson/config.json is not readable JSON" in err
    nofc = make_draft(tmp_path / "nofc", llama, drop=("fc.weight",))
    assert "no fc.weight" in _usage(capsys, "--draft", str(nofc), "--serve", "sglang", "--target", target)
    draft = make_draft(tmp_path / "d", llama)
    (tmp_path / "unfinished").mkdir()
    err = _usage(capsys, "--draft", str(draft), "--serve", "sglang", "--run", str(tmp_path / "unfinished"))
    assert "unfinished run" in err and "manifest.json does not exist" in err
    assert "name the target" in _usage(capsys, "--draft", str(draft), "--serve", "sglang")
    assert "does not exist" in _usage(capsys, "--draft", str(draft), "--serve", "sglang",
                                      "--export", str(tmp_path / "nowhere"))


@needs_sglang
def test_no_load_proof_is_claimed_for_another_version(tmp_path, llama, models_root):
    draft = make_draft(tmp_path / "d", llama, aux_ids=[0, 2, 4])
    found, _ = examine(Request(draft=draft, serve="sglang", target=models_root / "tiny-llama", serve_version="0.6.0"),
                       weights=check_weights)
    assert status(found, "weights") == {"WARN"}
    assert "loaded by sglang 0.5.23 (installed here), not sglang 0.6.0" in text(found, "weights")
