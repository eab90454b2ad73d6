"""`--last final_norm` in speculators' layout: final_norm divided by the checkpoint's final-norm weight, which the
trainer's own RMSNorm maps back to final_norm; every refusal (a checkpoint on disk, no engine)."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from pipeline.exports.slots import ExportError
from pipeline.exports import unnorm as unnorm_module
from pipeline.exports.unnorm import Unnorm
from pipeline.models.checkpoint import CheckpointTensors

H = 64


def _checkpoint(path, weight):
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": H, "rms_norm_eps": 1e-5}))
    save_file({"model.norm.weight": weight, "model.layers.0.input_layernorm.weight": torch.ones(H)},
              str(path / "model.safetensors"))
    return CheckpointTensors(path)


@pytest.fixture
def checkpoint(tmp_path):
    torch.manual_seed(0)
    return _checkpoint(tmp_path / "model", torch.randn(H) * 0.5 + 1.0)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 8e-3)])
def test_the_trainers_norm_of_the_written_slot_is_the_captured_final_norm(checkpoint, dtype, tol):
    bn = torch.randn(12, H) * 30  # a last layer's output, far from unit scale
    final = checkpoint.final_norm(bn).to(dtype)
    hidden = torch.stack([torch.randn(12, H).to(dtype), final], dim=1)  # [T, P, H]: an aux point, then final_norm
    unnorm = Unnorm(checkpoint, H)
    out = unnorm.apply(hidden, 1, "s0")
    assert out.dtype == dtype and torch.equal(out[:, 0], hidden[:, 0]) and torch.equal(hidden[:, 1], final)
    back = checkpoint.final_norm(out[:, 1])  # speculators: lm_head(verifier_norm(last slot))
    rel = float((back - final.float()).norm() / final.float().norm())
    assert rel < tol and unnorm.worst_rel_l2 == pytest.approx(rel, rel=1e-2)  # its own sums, in blocks of rows
    x = out[:, 1].float()
    assert float((x.pow(2).mean(-1) - 1).abs().max()) < 5 * tol  # unit RMS: bN's direction, not its scale
    record = unnorm.record()
    assert record["round_trip"] == {"samples_checked": 1, "worst_rel_l2": pytest.approx(rel, rel=1e-2)}
    assert "model.norm.weight" in record["how"] and len(record["norm_weight_float32_sha256"]) == 64


def test_a_state_that_is_not_this_checkpoints_final_norm_is_refused(checkpoint):
    bn = torch.randn(5, H) * 30
    with pytest.raises(ExportError, match=r"sample s7: .* is not .*model\.norm\.weight applied to its last layer"):
        Unnorm(checkpoint, H).apply(bn[:, None], 0, "s7")  # bN itself where final_norm should be


def test_an_all_zero_final_norm_is_refused_though_its_round_trip_holds(checkpoint):
    """0 / w = 0 and the norm of 0 is 0: the round trip alone would pass a zeroed final_norm (#35 item 8)."""
    final = checkpoint.final_norm(torch.randn(6, H) * 30)
    final[4] = 0
    with pytest.raises(ExportError, match=r"sample s3: token 4's final_norm divided by the norm's weight has mean "
                                          r"square 0, where a norm's output has ~1"):
        Unnorm(checkpoint, H).apply(final[:, None], 0, "s3")


def test_a_norm_weight_with_zeros_or_another_width_is_refused(tmp_path):
    weight = torch.ones(H)
    weight[3] = 0
    with pytest.raises(ExportError, match="1 zero entries"):
        Unnorm(_checkpoint(tmp_path / "zeros", weight), H)
    with pytest.raises(ExportError, match=r"has shape \(64,\), the run's states are 32 wide"):
        Unnorm(_checkpoint(tmp_path / "wide", torch.ones(H)), 32)


def test_a_run_whose_checkpoint_is_gone_is_refused(tmp_path):
    manifest = {"hidden_size": H, "provenance": {"model": {"path": str(tmp_path / "moved")}}}
    with pytest.raises(ExportError, match="its model path .*moved' holds no config.json"):
        Unnorm.of_run(manifest, tmp_path / "run")


@pytest.mark.parametrize("rows_per_block", [1, 5, 12, 100])
def test_the_slot_is_the_same_whatever_the_blocks_it_is_worked_in(checkpoint, monkeypatch, rows_per_block):
    """apply works the slot a few rows at a time (a reference export does it on every read): every block's rows are
    final_norm / w rounded once, the other points untouched, the round trip over the whole sample, and a bad token
    in a later block named by its own index."""
    monkeypatch.setattr(unnorm_module, "UNNORM_BLOCK_BYTES", rows_per_block * 4 * H)
    final = checkpoint.final_norm(torch.randn(12, H) * 30).to(torch.bfloat16)
    hidden = torch.stack([torch.randn(12, H).to(torch.bfloat16), final, torch.randn(12, H).to(torch.bfloat16)], dim=1)
    unnorm = Unnorm(checkpoint, H)
    out = unnorm.apply(hidden, 1, "s0")
    expected = (final.float() / checkpoint.norm_weight).to(torch.bfloat16)  # in float32, rounded once
    assert torch.equal(out[:, 1].view(torch.int16), expected.view(torch.int16))
    assert torch.equal(out[:, 0], hidden[:, 0]) and torch.equal(out[:, 2], hidden[:, 2])
    back = checkpoint.final_norm(out[:, 1])
    assert unnorm.worst_rel_l2 == pytest.approx(float((back - final.float()).norm() / final.float().norm()), rel=1e-2)
    zeroed = hidden.clone()
    zeroed[10, 1] = 0
    with pytest.raises(ExportError, match=r"sample s1: token 10's final_norm divided by the norm's weight"):
        unnorm.apply(zeroed, 1, "s1")
    shifted = hidden.clone()
    shifted[7:, 1] = hidden[7:, 0]  # the last rows are another point's: the whole sample's round trip is off
    with pytest.raises(ExportError, match=r"sample s2: the trainer's norm of final_norm / w is .* over 7.8e-03"):
        unnorm.apply(shifted, 1, "s2")
