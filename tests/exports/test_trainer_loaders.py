"""Exports of real runs read by each trainer's own loader classes, in its own environment, compared bit for bit with
the run's slots; and one optimisation step of each trainer's own EAGLE-3 draft on exported samples, on CPU."""
from __future__ import annotations

import json

import pytest
import torch

from pipeline.models.checkpoint import CheckpointTensors
from pipeline.shards.reader import RunReader
from tests.exports.conftest import cli, extract, read_all, trainer

pytestmark = pytest.mark.integration
RUNS = ("llama", "kimi", "resumed", "fp8")


def _export(run, out, fmt, *args) -> dict:
    proc = cli("pipeline.export", str(run), "--format", fmt, "--out", str(out), *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads((out / "export.json").read_text())


def _expected(run):
    """(sample_id, input_ids, loss_mask, hidden [T, P, H]) in the run's storage order, and the run's points."""
    with RunReader(run) as reader:
        return [(s["sample_id"], s["input_ids"], s["loss_mask"], s["hidden_states"]) for s in reader.iter_samples()], \
            reader.points


def test_the_runs_cover_both_dtypes_and_fp8_storage(runs):
    dtypes = {name: json.loads((run / "manifest.json").read_text())["dtype"] for name, run in runs.items()}
    assert dtypes == {"llama": "bfloat16", "kimi": "float32", "resumed": "bfloat16", "fp8": "float8_e4m3fn"}
    with RunReader(runs["fp8"]) as reader:  # what the exports hold, and the trainers must read bit-equal
        assert reader[reader.sample_ids[0]]["hidden_states"].dtype == torch.bfloat16


def _slot_indices(sidecar, points):
    aux = [points.index(s["point"]) for s in sidecar["slots"] if s["role"] == "aux"]
    (last,) = [points.index(s["point"]) for s in sidecar["slots"] if s["role"] == "last"]
    return aux, last


@pytest.mark.parametrize("name", RUNS)
def test_speculators_arrowdataset_reads_every_sample_bit_equal(name, runs, tmp_path):
    run = runs[name]
    sidecar = _export(run, tmp_path / "export", "speculators")
    result, loaded = trainer("speculators", "load", tmp_path / "export", tmp_path / "result")
    samples, points = _expected(run)
    aux, last = _slot_indices(sidecar, points)
    num_layers = sidecar["model"]["num_layers"]
    assert [s["point"] for s in sidecar["slots"]][-1] == f"b{num_layers}"  # bN, never final_norm
    assert result["num_rows"] == len(samples) == sidecar["num_samples"]
    got = read_all(loaded)
    for i, (sample_id, input_ids, loss_mask, hidden) in enumerate(samples):
        num_tokens = input_ids.shape[0]
        assert result["approx_lengths"][i] == num_tokens, sample_id  # nothing padded
        assert torch.equal(got[f"s{i}.input_ids"], input_ids), sample_id
        assert torch.equal(got[f"s{i}.loss_mask"], loss_mask.to(torch.int64)), sample_id
        aux_states, last_state = got[f"s{i}.hidden_states"], got[f"s{i}.verifier_last_hidden_states"]
        assert aux_states.dtype == last_state.dtype == hidden.dtype  # dtype kept
        assert torch.equal(aux_states, hidden[:, aux].flatten(1)), sample_id  # the draft's K aux inputs, in order
        assert torch.equal(last_state, hidden[:, last]), sample_id


@pytest.mark.parametrize("name", RUNS)
def test_specforge_offline_dataset_reads_every_sample_bit_equal(name, runs, tmp_path):
    run = runs[name]
    sidecar = _export(run, tmp_path / "export", "specforge")
    result, loaded = trainer("specforge", "load", tmp_path / "export", tmp_path / "result")
    samples, points = _expected(run)
    aux, last = _slot_indices(sidecar, points)
    assert points[last] == "final_norm" and len(aux) == 3
    assert result["num_files"] == result["num_refs"] == len(samples) and result["same_order"]
    assert [f["path"] for f in result["files"]] == sorted(f["path"] for f in result["files"])
    got = read_all(loaded)
    for i, (sample_id, input_ids, loss_mask, hidden) in enumerate(samples):
        num_tokens, hidden_size = input_ids.shape[0], hidden.shape[-1]
        assert torch.equal(got[f"s{i}.input_ids"], input_ids), sample_id
        assert torch.equal(got[f"s{i}.loss_mask"], loss_mask.to(torch.int64)), sample_id
        final, aux_states = got[f"s{i}.hidden_state"], got[f"s{i}.aux_hidden_state"]
        assert final.shape == (1, num_tokens, hidden_size) and aux_states.shape == (1, num_tokens, 3 * hidden_size)
        assert final.dtype == aux_states.dtype == hidden.dtype
        assert torch.equal(final[0], hidden[:, last]), sample_id
        assert torch.equal(aux_states[0], hidden[:, aux].flatten(1)), sample_id  # low, mid, high along the hidden axis
        # what OfflineEagle3Dataset hands to training: the same tensors, the trainer zeroes the last loss position
        assert torch.equal(got[f"s{i}.target"], final) and torch.equal(got[f"s{i}.train_hidden"], aux_states)
        want_mask = loss_mask.to(torch.int64).clone()
        want_mask[-1] = 0
        assert torch.equal(got[f"s{i}.train_loss_mask"][0], want_mask), sample_id


@pytest.mark.parametrize("fmt", ["speculators", "specforge"])
def test_one_optimisation_step_of_the_trainers_own_eagle3_draft(fmt, trained):
    _, result, draft = trained(fmt)
    assert (draft / "config.json").is_file()  # saved by the trainer's own save_pretrained (tests/exports/test_doctor.py)
    assert result["num_samples"] == 3
    assert torch.isfinite(torch.tensor([result["loss"], result["loss_after"]])).all(), result
    assert result["params_changed"] > 0 and result["loss_after"] < result["loss"], result


def test_sidecar_names_every_slot_in_sglang_and_vllm_numbering(kimi_run, tmp_path):
    sidecar = _export(kimi_run, tmp_path / "export", "specforge")
    manifest = json.loads((kimi_run / "manifest.json").read_text())
    assert sidecar["run_provenance_digest"] == manifest["provenance_digest"]
    assert [s["point"] for s in sidecar["slots"]] == ["b1", "b4", "b7", "final_norm"]
    assert sidecar["model"]["num_layers"] == 8
    # SGLang 0.5.23 (DeepSeek) moves every aux id by +1 when the list starts at 1: it cannot be fed b1,b4,b7, and the
    # sidecar says so instead of naming ids that would serve other layers; vLLM: id k = boundary k
    sglang = sidecar["serving"]["sglang"]
    assert sglang["aux_layer_ids"] is None and "+1" in sglang["aux_error"], sglang
    assert sidecar["serving"]["vllm"]["aux_layer_ids"] == [1, 4, 7]
    shifted = _export(kimi_run, tmp_path / "shifted", "specforge", "--aux", "b0,b4,b7")
    assert shifted["serving"]["sglang"]["aux_layer_ids"] == [0, 4, 7]
    assert sidecar["last_state"]["derived"] is False and sidecar["pickle"] is True
    spec = _export(kimi_run, tmp_path / "spec", "speculators")
    # bN is the trainer's target: SGLang cannot capture it, which does not stop it serving the draft its aux states
    note = spec["serving"]["sglang"]["note"]
    assert spec["serving"]["sglang"]["last"] is None and "cannot capture bN" in note and "only its aux states" in note
    assert "with vLLM" not in note, note
    assert spec["serving"]["vllm"]["last"] == 8 and spec["pickle"] is False


def test_speculators_reads_final_norm_divided_by_the_norm_weight_as_the_engines_final_norm(llama_run, tmp_path,
                                                                                          models_root):
    """A run without bN (what SGLang captures) exported with --last final_norm: speculators' own loader reads the
    derived last slot, and its norm (lm_head(norm(x)) is all it does with it) gives the captured final_norm back, so
    its targets are the tokens the bN export of the same samples gives."""
    run = extract(tmp_path / "run", "model=tiny_llama", "capture.points=[1,3,5,final_norm]", "data.limit=4")
    refused = cli("pipeline.export", str(run), "--format", "speculators", "--out", str(tmp_path / "refused"))
    assert refused.returncode == 2 and "--last final_norm" in refused.stderr and not (tmp_path / "refused").exists()
    sidecar = _export(run, tmp_path / "export", "speculators", "--last", "final_norm")
    last_state = sidecar["last_state"]
    assert [s["point"] for s in sidecar["slots"]] == ["b1", "b3", "b5", "final_norm"] and last_state["derived"]
    assert last_state["round_trip"]["samples_checked"] == 4 and last_state["round_trip"]["worst_rel_l2"] < 8e-3
    result, loaded = trainer("speculators", "load", tmp_path / "export", tmp_path / "result")
    got = read_all(loaded)
    checkpoint = CheckpointTensors(models_root / "tiny-llama")
    head = checkpoint.head_weight.float()
    with RunReader(llama_run) as bn_run:  # the same samples, captured with bN
        by_id = {s["sample_id"]: s for s in bn_run.iter_samples()}
        bn_index = bn_run.points.index("b6")
    samples, points = _expected(run)
    assert result["num_rows"] == len(samples) == 4
    for i, (sample_id, _, _, hidden) in enumerate(samples):
        last = got[f"s{i}.verifier_last_hidden_states"]
        assert last.dtype == hidden.dtype == torch.bfloat16
        final = hidden[:, points.index("final_norm")].float()
        back = checkpoint.final_norm(last)
        assert float((back - final).norm() / final.norm()) < 8e-3, sample_id
        assert torch.equal(got[f"s{i}.hidden_states"], hidden[:, :3].flatten(1)), sample_id  # aux slots copied
        targets = (back @ head.T).argmax(-1)
        from_bn = (checkpoint.final_norm(by_id[sample_id]["hidden_states"][:, bn_index]) @ head.T).argmax(-1)
        assert (targets == from_bn).float().mean() > 0.95, sample_id
