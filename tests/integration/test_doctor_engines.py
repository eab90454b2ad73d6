"""The doctor against the engines' own code: its aux-id translations (pipeline/points.py's table, by model class) equal
what SGLang's and vLLM's own EAGLE-3 setters do on the Llama, DeepSeek and Kimi-K2.5 wrapper classes; vLLM's own
config loader reads the ids the doctor says it reads; and the weight-load proof runs SGLang's own loader on drafts
built here (a misnamed one is caught, the MLA draft for Kimi loads)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from pipeline.drafts.checkpoint import read_draft
from pipeline.drafts.load import findings_from, run_probe
from pipeline.drafts.residual import rule_for, served_with
from pipeline.drafts.serving import view
from pipeline.points import PointError, family_of, from_native, numbering_for
from tests.helpers.drafts import make_draft
from tests.helpers.markers import SGLANG_PYTHON, VLLM_PYTHON, needs_sglang, needs_vllm

pytestmark = pytest.mark.integration
PROBE = Path(__file__).resolve().parent / "probes" / "engine_numbering.py"
N = 8
IDS = [[0, 2, 4], [1, 3, 5], [1, 2, 5], [0, 4, 7], [2, 4, 7], [3, 5, 8]]
CLASSES = {"LlamaForCausalLM": "llama", "DeepseekV2ForCausalLM": "deepseek_v3",
           "KimiK25ForConditionalGeneration": "kimi_k25"}


def _probe(python: Path, framework: str, tmp: Path, drafts=()) -> dict:
    request = tmp / f"{framework}-request.json"
    request.write_text(json.dumps({"num_layers": N, "ids": IDS, "drafts": [str(d) for d in drafts]}))
    result = tmp / f"{framework}-result.json"
    proc = subprocess.run([str(python), str(PROBE), framework, str(request), str(result)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "SGLANG_USE_CPU_ENGINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(result.read_text())


def _doctor_boundaries(framework: str, architecture: str, ids: list[int]) -> list[int] | None:
    model_type = CLASSES[architecture]
    row, known = numbering_for(framework, model_type=model_type, architecture=architecture,
                               version={"sglang": "0.5.23", "vllm": "0.32.0"}[framework])
    assert known
    try:
        return [p.boundary for p in from_native(ids, framework=row.convention, family=family_of(model_type),
                                                num_layers=N)]
    except PointError:
        return None  # refused


def _engine_boundaries(values: list[int], framework: str) -> list[int] | None:
    """The boundaries an engine's forward captures for these layer values; None when one is never reached (SGLang
    compares the layer index 0..N-1; vLLM also the end of the stack, N). SGLang 0.5.23 then raises at the first
    forward (fewer aux states than requested), so the server refuses the list."""
    top = N if framework == "vllm" else N - 1
    return None if any(not 0 <= v <= top for v in values) else sorted(set(values))


@needs_sglang
def test_sglang_numbering_by_model_class_is_the_engines_own(tmp_path):
    got = _probe(SGLANG_PYTHON, "sglang", tmp_path)["classes"]
    for architecture, lists in got.items():
        for ids, values in zip(IDS, lists):
            assert _doctor_boundaries("sglang", architecture, ids) == _engine_boundaries(values, "sglang"), \
                (architecture, ids, values)
    assert got["KimiK25ForConditionalGeneration"] == got["DeepseekV2ForCausalLM"]  # the wrapper delegates
    assert got["DeepseekV2ForCausalLM"][1] == [2, 4, 6]  # the +1 quirk: [1, 3, 5] starts with 1


@needs_vllm
def test_vllm_numbering_and_the_ids_it_reads_from_a_draft(tmp_path, models_root):
    llama = json.loads((models_root / "tiny-llama" / "config.json").read_text())
    drafts = {"eagle_config": make_draft(tmp_path / "a", llama, aux_ids=[0, 2, 4]),
              "speculators": make_draft(tmp_path / "b", llama, schema="speculators", aux_ids=[1, 3, 5]),
              "both": make_draft(tmp_path / "c", llama, aux_ids=[1, 3, 5], ids_at="top",
                                 config_extra={"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 2, 4]}}),
              # the flags vLLM's draft classes read, as vLLM's own loader hands them over
              "norm-flags": make_draft(tmp_path / "d", llama, config_extra={"norm_before_residual": True,
                                                                           "norm_output": True}),
              "speculators-top-norm-output": make_draft(tmp_path / "e", llama, schema="speculators",
                                                        config_extra={"norm_output": True}),
              "speculators-no-residual-key": make_draft(tmp_path / "f", llama, schema="speculators")}
    _edit(drafts["speculators-top-norm-output"], lambda c: c["transformer_layer_config"].update(norm_output=False))
    _edit(drafts["speculators-no-residual-key"], lambda c: c.pop("norm_before_residual"))
    got = _probe(VLLM_PYTHON, "vllm", tmp_path, drafts.values())
    for architecture, lists in got["classes"].items():
        for ids, values in zip(IDS, lists):
            assert _doctor_boundaries("vllm", architecture, ids) == _engine_boundaries(values, "vllm"), \
                (architecture, ids, values)
    for name, path in drafts.items():
        doctor = view(read_draft(path), "vllm", model_type="llama", architecture="LlamaForCausalLM", version=None)
        assert doctor.ids == got["drafts"][str(path)], name
    assert got["drafts"][str(drafts["both"])] == [1, 3, 5]  # the top level wins over eagle_config
    for name, path in drafts.items():  # norm_before_residual / norm_output: what the doctor says vLLM applies
        draft = read_draft(path)
        served, _ = served_with(draft, rule_for("vllm", draft.format, "0.32.0")[0])
        flags = got["flags"][str(path)]
        assert flags["norm_before_residual"] == served and flags["norm_output"] == bool(draft.norm_output), name
    assert got["flags"][str(drafts["speculators-no-residual-key"])]["norm_before_residual"] is True
    assert got["flags"][str(drafts["speculators-top-norm-output"])]["norm_output"] is True


def _edit(draft: Path, change) -> None:
    config = json.loads((draft / "config.json").read_text())
    change(config)
    (draft / "config.json").write_text(json.dumps(config))


@needs_sglang
def test_sglangs_own_loader_loads_llama_and_mla_drafts_and_catches_a_misnamed_one(tmp_path, models_root):
    """One probe for all three (one SGLang start-up): midlayer.* into LlamaForCausalLMEagle3; the MLA draft for Kimi
    (layers.0.*, q_a_proj and kv_a_proj_with_mqa fused by the class) into Eagle3DeepseekV2ForCausalLM; a decoder layer
    saved under a wrapper's prefix, which SGLang drops without a word. (The doctor's CLI runs this probe end to end in
    tests/exports/test_doctor.py.)"""
    llama = json.loads((models_root / "tiny-llama" / "config.json").read_text())
    kimi = json.loads((models_root / "tiny-kimi-bf16" / "config.json").read_text())
    drafts = [make_draft(tmp_path / "llama", llama, aux_ids=[0, 2, 4], draft_vocab=1024),
              make_draft(tmp_path / "mla", kimi, schema="mla", aux_ids=[0, 4, 7], draft_vocab=1024),
              make_draft(tmp_path / "bad", llama, aux_ids=[0, 2, 4], prefix="draft_model.midlayer")]
    good, mla, bad = run_probe("sglang", *drafts)
    assert [r["class"] for r in (good, mla, bad)] == ["LlamaForCausalLMEagle3", "Eagle3DeepseekV2ForCausalLM",
                                                      "LlamaForCausalLMEagle3"]
    for result in (good, mla):
        found = {f.status: f.message for f in findings_from(result, "sglang 0.5.23")}
        assert set(found) == {"OK"}, found
        assert result["dropped"] == ["t2d"] and result["uninitialised"] == ["model.embed_tokens.weight"]
    assert mla["wrote"]["layers.0.self_attn.q_a_proj.weight"] == [
        "model.midlayer.self_attn.fused_qkv_a_proj_with_mqa.weight"]
    dropped, uninitialised = findings_from(bad, "sglang 0.5.23")
    assert dropped.status == uninitialised.status == "MISMATCH"
    assert "LlamaForCausalLMEagle3.load_weights dropped 10 checkpoint tensors" in dropped.message
    assert "left 7 parameters uninitialised: model.layers.0.self_attn.qkv_proj.weight" in uninitialised.message


@needs_vllm
def test_vllms_own_loader_loads_a_draft_and_refuses_a_misnamed_one(tmp_path, models_root):
    """One probe for both (vLLM builds its draft class over the target's config): midlayer.* and d2t into
    Eagle3LlamaForCausalLM; a decoder layer saved under another name is refused by vLLM with its own error."""
    llama = json.loads((models_root / "tiny-llama" / "config.json").read_text())
    drafts = [make_draft(tmp_path / "good", llama, aux_ids=[1, 3, 5], draft_vocab=1024),
              make_draft(tmp_path / "bad", llama, aux_ids=[1, 3, 5], prefix="draft_model.layers.0")]
    good, bad = run_probe("vllm", *drafts, target_dir=models_root / "tiny-llama")
    assert good["class"] == "Eagle3LlamaForCausalLM"
    assert {f.status for f in findings_from(good, "vllm 0.32.0")} == {"OK"}, good
    assert good["wrote"]["d2t"] == [] and "d2t" not in good["dropped"]  # collected first, loaded at the end
    (refused,) = findings_from(bad, "vllm 0.32.0")
    assert refused.status == "MISMATCH" and "no module or parameter named 'draft_model'" in refused.message


@needs_vllm
def test_a_parameter_vllms_forward_never_reads_is_no_mismatch_but_one_it_reads_is(tmp_path, models_root):
    """vLLM builds a hidden_norm in every Eagle-3 decoder layer and applies only layer 0's: a two-layer draft without
    layers.1.hidden_norm (there is nothing to train) is served as trained, which one draft step on CPU proves; a
    missing layers.1.input_layernorm or layers.0.hidden_norm, both read by that step, is a mismatch."""
    llama = json.loads((models_root / "tiny-llama" / "config.json").read_text())
    drafts = [make_draft(tmp_path / name, llama, schema="speculators", num_layers=2, drop=drop)
              for name, drop in (("two", ()), ("no-input-norm", ("layers.1.input_layernorm.weight",)),
                                 ("no-first-hidden-norm", ("layers.0.hidden_norm.weight",)))]
    two, no_input_norm, no_first = run_probe("vllm", *drafts, target_dir=models_root / "tiny-llama")
    assert "model.layers.1.hidden_norm.weight" in two["uninitialised"]
    assert two["unused"] == ["model.layers.1.hidden_norm.weight"], two
    (ok,) = findings_from(two, "vllm 0.32.0")
    assert ok.status == "OK" and "initialised every parameter its forward reads" in ok.message
    assert "model.layers.1.hidden_norm.weight left unset but never read by the server's forward" in ok.message
    for result, name in ((no_input_norm, "model.layers.1.input_layernorm.weight"),
                         (no_first, "model.layers.0.hidden_norm.weight")):
        (found,) = findings_from(result, "vllm 0.32.0")
        assert found.status == "MISMATCH" and f"left 1 parameters uninitialised: {name}" in found.message, result


@needs_sglang
def test_sglangs_eagle3_drafts_never_read_norm_before_residual(tmp_path):
    """The residual table's SGLang row, against the installed source: neither EAGLE-3 draft class reads the key (it
    keeps the residual before hidden_norm), while both read norm_output."""
    proc = subprocess.run([str(SGLANG_PYTHON), "-c", "import importlib.util as u; print(u.find_spec('sglang').origin)"],
                          capture_output=True, text=True, timeout=120)
    models = Path(proc.stdout.strip()).parent / "srt" / "models"
    for name in ("llama_eagle3.py", "kimi_k25_eagle3.py"):
        source = (models / name).read_text()
        assert "norm_before_residual" not in source and "norm_output" in source, name
    rule, known = rule_for("sglang", "specforge", "0.5.23")
    assert known and not rule.honours
