"""The diff with the serving engines, configured only (no code of theirs is named here): vLLM's real CPU rotary bug
on the default-rope model stops extract at the gate; vLLM and SGLang agree with HF in float32 on the yarn model; a
vLLM reference that vLLM refuses to start is reported as a start failure by the gate and by the diff.

Each test skips when the engine's own virtualenv is absent (scripts/setup.sh creates them)."""
from __future__ import annotations

import json

import pytest

from pipeline.compare.job import run_diff
from pipeline.run.gate import DiffGateError
from pipeline.run.job import run_extract
from tests.helpers.diff import SMALL_PROBE, composed, diff_composed
from tests.helpers.markers import needs_sglang, needs_vllm

pytestmark = [pytest.mark.integration, pytest.mark.slow]
# vLLM refuses to start: one 131072-token sequence of the 8-layer float32 MLA model needs 2.25 GiB of KV cache, and
# both options are given, so the adapter sizes nothing.
UNSTARTABLE = "{name:vllm,dtype:float32,options:{max_model_len:131072,kv_cache_space_gib:1}}"
VLLM_REFUSAL = "ValueError: To serve at least one request with the model's max seq len (131072)"


@needs_vllm
def test_the_gate_stops_vllm_on_the_default_rope_model(tmp_path, models_root):
    out = tmp_path / "run"
    with pytest.raises(DiffGateError) as stop:
        run_extract(composed(f"out_dir={out}", "model=tiny_kimi_bf16_defaultrope", "engine=vllm",
                             "engine.dtype=float32", "data.limit=4", "gate.probe.num_samples=3",
                             "diff.html=false"))
    assert "vllm@float32 (primary) vs hf@float32" in str(stop.value)
    assert sorted(p.name for p in out.iterdir()) == [".lock", "diff"]  # stopped before any shard (the lock, released)
    report = json.loads((out / "diff" / "report.json").read_text())
    pair = next(p for p in report["pairs"] if p["kind"] == "reference")
    b1 = pair["points"]["b1"]
    print(f"\nvLLM CPU rope bug at b1: rel L2 {b1['rel_l2']:.2e}, position 0 {b1['pos0']:.1e}, later {b1['later']:.2e}")
    assert pair["onset"] == "b1" and pair["locus"].startswith("attention / positions in layer 1: position 0 agrees")
    assert b1["pos0"] < 1e-5 and b1["later"] > 1e-2
    batch = next(p for p in report["pairs"] if p["kind"] == "batch")  # the error depends on what else is in the batch
    assert batch["status"] == "fail" and batch["onset"] == "b1"
    assert report["alignment"][0]["status"] == "ok"  # not a convention error: the numbering is right


@needs_vllm
@needs_sglang
def test_vllm_and_sglang_agree_with_hf_in_float32(tmp_path, models_root):
    result = run_diff(diff_composed(f"out_dir={tmp_path}", "model=tiny_kimi_bf16",
                               "diff.engines=[vllm@float32,sglang@float32]", "diff.points=[embed,1,4,7,final_norm]", "diff.probe.num_samples=3",
                               "diff.probe.max_tokens=64", "diff.probe.repeats=1", "diff.probe.alone=0",
                               "diff.html=false")).result
    assert result.status == "pass", result.failures + result.warnings
    for pair in (p for p in result.pairs if p.kind == "reference"):
        assert max(s.rel_l2 for s in pair.points.values()) < 1e-5 and pair.logits.top1 == 1.0
    assert [a.status for a in result.alignments] == ["ok", "ok"]  # each engine's id translation, verified


@needs_vllm
def test_a_reference_that_does_not_start_is_a_start_failure_not_a_divergence(tmp_path, models_root):
    out = tmp_path / "run"
    with pytest.raises(DiffGateError) as stop:
        run_extract(composed(f"out_dir={out}", "model=tiny_kimi_bf16", "engine.dtype=float32",
                             f"diff.reference={UNSTARTABLE}", "data.limit=4", "gate.probe.num_samples=3",
                             "diff.html=false"))
    message = str(stop.value)
    assert "engine vllm@float32 (reference) failed to start: " in message and VLLM_REFUSAL in message
    assert "capture convention" not in message and "out of line" not in message
    assert sorted(p.name for p in out.iterdir()) == [".lock", "diff"]
    report = json.loads((out / "diff" / "report.json").read_text())
    # stopped before the primary started: there was nothing to hold it against
    assert [(e["role"], e["failed_at"]) for e in report["engines"]] == [("reference", "start")]
    assert VLLM_REFUSAL in report["engines"][0]["error"] and "\n" not in report["engines"][0]["error"]

    result = run_diff(diff_composed(f"out_dir={tmp_path / 'diff'}", "model=tiny_kimi_bf16",
                                    f"diff.reference={UNSTARTABLE}", "diff.engines=[hf@float32]", *SMALL_PROBE,
                                    "diff.html=false")).result
    assert result.status == "fail"
    assert result.failures[0].startswith("engine vllm@float32 failed to start: ") and VLLM_REFUSAL in result.failures[0]
