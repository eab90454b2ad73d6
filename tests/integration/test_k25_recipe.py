"""The Kimi recipe as written (`+exp=kimi`), on the tiny checkpoint in Kimi-K2.5's layout, with only what a CPU forces
changed (TP 1, and float32 for the tiny random weights): SGLang primary, the vLLM reference gate, the canonical points [embed, 3, 31, 59, final_norm] translated
to SGLang's DeepSeek ids and verified on the loaded wrapper; the shards verify."""
from __future__ import annotations

import json

import pytest

from tests.helpers.cli import cli
from tests.helpers.markers import needs_engine

pytestmark = [pytest.mark.integration, pytest.mark.slow, needs_engine("sglang", "vllm")]
# model_gate=kimi_k25: the real model's gate (conf/model_gate/), which a model choice of its own does not select
RECIPE = ["+exp=kimi", "model=tiny_k25_bf16", "model_gate=kimi_k25", "engine.tp_size=1", "diff.reference.tp_size=1"]
# float32: the tiny model's random MoE is chaotic over 61 bf16 layers (routing flips), and the gate stops a bf16 run
# (docs/how-to/kimi-gpu-node.md, "Rehearse the recipe on CPU"). Nothing else: the page's line as
# written (vLLM sizes its KV cache from the run).
CPU = ["engine.dtype=float32", "diff.reference.dtype=float32"]
SMALL = ["data.limit=8"]  # the bundled conversations; everything else as the recipe says


@pytest.fixture(scope="module")
def recipe_run(tmp_path_factory, tiny_model):
    tiny_model("tiny-k25-bf16")
    out = tmp_path_factory.mktemp("kimi_recipe") / "run"
    proc = cli("pipeline.extract", *RECIPE, *CPU, *SMALL, f"out_dir={out}", f"hydra.run.dir={out.parent / 'logs'}",
               timeout=1500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out, proc


def test_recipe_captures_through_sglang_on_the_wrapper(recipe_run):
    out, proc = recipe_run
    assert "capture points: b0, b3, b31, b59, final_norm" in proc.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    engine = manifest["provenance"]["engine"]
    assert engine["framework"] == "sglang" and manifest["hidden_size"] == 256
    extra = engine["extra"]
    assert (extra["model_class"], extra["wrapper_class"]) == ("KimiK25ForConditionalGeneration",) * 2
    # canonical b3/b31/b59 = the input of decoder layers 3/31/59, as the loaded wrapper's language model reports them
    assert extra["layers_to_capture"][-3:] == [3, 31, 59] and extra["text_class"] == "DeepseekV3ForCausalLM"
    assert manifest["num_samples"] == 8


def test_the_vllm_gate_passed_before_any_shard(recipe_run):
    out, proc = recipe_run
    reports = list(out.rglob("report.json"))
    assert reports, sorted(str(p.relative_to(out)) for p in out.rglob("*"))[:20]
    report = json.loads(reports[0].read_text())
    labels = {e["label"]: e for e in report["engines"]}
    assert any(label.startswith("vllm") for label in labels) and any(label.startswith("sglang") for label in labels)
    vllm = next(e for label, e in labels.items() if label.startswith("vllm"))
    assert vllm["info"]["extra"]["wrapper_class"] == "KimiK25ForConditionalGeneration"
    # the line runs as written because vLLM was sized from the probe, not from the checkpoint's 262144 positions
    sizes, longest = vllm["info"]["extra"]["sizes"], max(s["num_tokens"] for s in report["probe"]["samples"])
    print(f"\nvLLM reference sized from the run: {sizes}, longest probe sample {longest} tokens")
    assert sizes["max_model_len"] == longest + 1 and sizes["max_model_len_by"].startswith("the run's longest")
    assert vllm["info"]["extra"]["environment"]["VLLM_CPU_KVCACHE_SPACE"] == str(sizes["kv_cache_space_gib"])


def test_recipe_shards_verify(recipe_run):
    out, _ = recipe_run
    proc = cli("pipeline.verify", str(out))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
