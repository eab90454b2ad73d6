"""The diff with the serving engines, configured only (no code of theirs is named here): vLLM's real CPU rotary bug
on the default-rope model stops extract at the gate; vLLM and SGLang agree with HF in float32 on the yarn model.

Each test skips when the engine's own virtualenv is absent (scripts/setup.sh creates them)."""
from __future__ import annotations

import json

import pytest

from pipeline.compare.stage import run_diff
from pipeline.run.gate import DiffGateError
from pipeline.run.job import run_extract
from tests.helpers.diff import composed
from tests.helpers.markers import needs_sglang, needs_vllm

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@needs_vllm
def test_the_gate_stops_vllm_on_the_default_rope_model(tmp_path, models_root):
    out = tmp_path / "run"
    with pytest.raises(DiffGateError) as stop:
        run_extract(composed(f"out_dir={out}", "model=tiny_kimi_bf16_defaultrope", "engine=vllm",
                             "engine.dtype=float32", "data.limit=4", "diff.gate_probe.num_samples=3",
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
    result = run_diff(composed(f"out_dir={tmp_path}", "model=tiny_kimi_bf16",
                               "diff.engines=[vllm@float32,sglang@float32]", "diff.points=[embed,1,4,7,final_norm]", "diff.probe.num_samples=3",
                               "diff.probe.max_tokens=64", "diff.probe.repeats=1", "diff.probe.alone=0",
                               "diff.html=false")).result
    assert result.status == "pass", result.failures + result.warnings
    for pair in (p for p in result.pairs if p.kind == "reference"):
        assert max(s.rel_l2 for s in pair.points.values()) < 1e-5 and pair.logits.top1 == 1.0
    assert [a.status for a in result.alignments] == ["ok", "ok"]  # each engine's id translation, verified
