"""The SGLang engine (real SGLang 0.5.23, in .venv-sglang) against the HF reference on the tiny models, float32.

Engines start once per module and model (9-40 s each on these CPUs): the main engines capture every point SGLang can
capture; two more pass SpecForge-style native id lists verbatim to show the numbering quirk on the real engine.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.core.contracts import EngineSpec
from pipeline.engines.process.remote import EngineWorkerError
from pipeline.engines.registry import REPO_ROOT, engine_class, make_engine
from pipeline.engines.sglang.cpu import sgl_kernel_standin
from pipeline.engines.sglang.plan import AUX, TABLE, make_plan
from pipeline.models.info import read_model_info
from pipeline.points import Point, PointError, parse_points
from tests.helpers.cli import cli
from tests.helpers.markers import SGLANG_PYTHON, needs_sglang, skip_without
from tests.helpers.samples import rel_l2, samples_of

pytestmark = [pytest.mark.integration]
TOLERANCE = 1e-5  # relative L2, float32


def engine_kwargs(path: Path, points, **options):
    """`make_engine(spec, **rest)` arguments: float32, these options; tp_size among them goes to the spec's field."""
    info = read_model_info(path)
    spec = EngineSpec(name="sglang", dtype="float32", tp_size=options.pop("tp_size", 1), options=options)
    return dict(spec=spec, model_path=str(path), points=parse_points(points, num_layers=info.num_layers),
                num_layers=info.num_layers)


def hf_reference(path: Path, samples) -> dict[str, dict[str, torch.Tensor]]:
    """sample id -> canonical label -> [T, H], every boundary and final_norm, from the HF engine in float32."""
    info = read_model_info(path)
    labels = list(range(info.num_layers + 1)) + ["final_norm"]
    kwargs = engine_kwargs(path, labels, attn_implementation="sdpa")
    kwargs["spec"].name = "hf"
    with engine_class("hf")(**kwargs) as hf:
        caps = hf.capture(samples)
        names = [p.label for p in hf.points]
    return {c.sample_id: {n: c.hidden_states_TPH[:, j] for j, n in enumerate(names)} for c in caps}


def capturable(num_layers: int) -> list:
    """Every point SGLang can capture: b0..b(N-1) and final_norm (bN cannot be)."""
    return list(range(num_layers)) + ["final_norm"]


# --- without an engine: the CPU stand-in and the capture plan -------------------------------------------------------


def test_every_stand_in_function_raises():
    module = sgl_kernel_standin.build_module()
    assert sorted(sgl_kernel_standin.NAMES) == sorted(n for n in vars(module) if not n.startswith("_")
                                                       and n != "IS_PIPELINE_STAND_IN")
    for name in sgl_kernel_standin.NAMES:
        with pytest.raises(sgl_kernel_standin.StandInCalled, match=f"sgl_kernel.{name} .*needs the real kernel"):
            getattr(module, name)(torch.zeros(1), 3)
    with pytest.raises(AttributeError):  # an unlisted name is absent, so `from sgl_kernel import x` fails as usual
        module.fused_experts_cpu


def test_cpu_layer_refuses_to_load_off_the_cpu_engine(monkeypatch):
    from pipeline.engines.sglang import cpu as sglang_cpu

    monkeypatch.delenv("SGLANG_USE_CPU_ENGINE", raising=False)
    with pytest.raises(RuntimeError, match="CPU engine only"):
        sglang_cpu.activate()


@needs_sglang
def test_stand_in_as_imported_in_the_engine_environment():
    code = ("import importlib, torch\n"
            "from pipeline.engines.sglang.cpu import sgl_kernel_standin as s\n"
            "assert s.install()\n"
            "import sgl_kernel\n"
            "assert s.is_stand_in(sgl_kernel)\n"
            "raised = []\n"
            "for name in s.NAMES:\n"
            "    try: getattr(sgl_kernel, name)(torch.zeros(2))\n"
            "    except s.StandInCalled: raised.append(name)\n"
            "try:\n"
            "    from sgl_kernel import fused_experts_cpu\n"
            "except ImportError: raised.append('<import of an unlisted name>')\n"
            "print(len(raised), len(s.NAMES) + 1)\n")
    out = subprocess.run([str(SGLANG_PYTHON), "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    raised, expected = out.stdout.split()
    assert raised == expected


@pytest.mark.parametrize("family, ids, boundaries", [
    ("deepseek", [1, 2, 5], [2, 3, 6]),  # the first id is 1: SGLang adds 1 to every id
    ("deepseek", [2, 3, 6], [2, 3, 6]),
    ("deepseek", [0, 1, 4, 7], [0, 1, 4, 7]),  # id 1 is not first: no shift
    ("llama", [1, 2, 4], [2, 3, 5]),  # Llama: always +1
    ("llama", [0, 2], [1, 3]),
])
def test_plan_reads_native_lists_with_the_model_class_numbering(family, ids, boundaries):
    plan = make_plan([Point(b) for b in boundaries], family=family, num_layers=8, aux_layer_ids=ids)
    assert plan.layers_to_capture == boundaries and [p.native_id for p in plan.points] == ids


def test_plan_refuses_a_native_list_that_disagrees_with_the_points():
    with pytest.raises(PointError, match=r"captures boundaries \[2, 3, 6\].*asks for \[1, 2, 5\]"):
        make_plan([Point(1), Point(2), Point(5)], family="deepseek", num_layers=8, aux_layer_ids=[1, 2, 5])


def test_plan_anchors_deepseek_lists_that_would_start_with_1():
    plan = make_plan([Point(1), Point(4), Point(None)], family="deepseek", num_layers=8)
    assert plan.aux_layer_ids == [0, 1, 4] and plan.anchor
    assert [(p.source, p.column) for p in plan.points] == [(AUX, 1), (AUX, 2), ("final_norm", None)]


def test_plan_takes_the_llama_embedding_from_the_table():
    plan = make_plan([Point(0), Point(2)], family="llama", num_layers=6)
    assert [p.source for p in plan.points] == [TABLE, AUX] and plan.aux_layer_ids == [1]


@pytest.mark.parametrize("family", ["deepseek", "llama"])
def test_plan_refuses_the_last_layer_output(family):
    with pytest.raises(PointError, match="b8 .*cannot be captured by SGLang 0.5.23"):
        make_plan([Point(0), Point(8)], family=family, num_layers=8)


# --- the real engine ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-kimi-bf16"])
def started(request, tiny_model):
    skip_without("sglang")
    path = tiny_model(request.param)
    info = read_model_info(path)
    single, batch = samples_of([37]), samples_of([5, 41, 17, 1, 29], seed=1)
    reference = hf_reference(path, single + batch)
    with make_engine(**engine_kwargs(path, capturable(info.num_layers))) as engine:
        yield engine, path, info, reference, single, batch


def test_every_point_equals_hf(started):
    engine, _, info, reference, single, _ = started
    (cap,) = engine.capture(single)
    assert cap.hidden_states_TPH.shape == (37, len(engine.points), info.hidden_size)
    assert cap.hidden_states_TPH.dtype == torch.float32
    expected = reference[cap.sample_id]
    errors = {p.label: rel_l2(cap.hidden_states_TPH[:, j], expected[p.label]) for j, p in enumerate(engine.points)}
    print(f"\n{info.model_type}: relative L2 vs HF:", {k: f"{v:.1e}" for k, v in errors.items()})
    assert max(errors.values()) <= TOLERANCE, errors
    assert rel_l2(expected["b2"], expected["b1"]) > 1e-2  # a point shifted by one layer could not pass


def test_embedding_is_exact(started, tiny_model):
    engine, path, _, reference, single, _ = started
    from safetensors.torch import load_file

    (cap,) = engine.capture(single)
    table = load_file(str(path / "model.safetensors"))["model.embed_tokens.weight"].float()
    ids = torch.from_numpy(single[0].input_ids_T)
    assert torch.equal(cap.hidden_states_TPH[:, 0], reference[cap.sample_id]["b0"])
    assert torch.equal(cap.hidden_states_TPH[:, 0], table[ids])
    method = engine.info().points[0].method
    # Llama's aux capture cannot record the embedding; DeepSeek's can (id 0), and the values are identical.
    assert ("embedding table" in method) == (engine.info().extra["model_class"] == "LlamaForCausalLM")


def test_batch_equals_single_runs_with_ids_checked_per_sample(started):
    engine, _, _, reference, _, batch = started
    together = engine.capture(batch)
    assert [c.sample_id for c in together] == [s.sample_id for s in batch]
    worst = 0.0
    for sample, cap in zip(batch, together):
        (alone,) = engine.capture([sample])
        assert np.array_equal(cap.input_ids_T, sample.input_ids_T)  # what the engine really consumed
        assert cap.hidden_states_TPH.shape[0] == sample.num_tokens
        worst = max(worst, rel_l2(cap.hidden_states_TPH, alone.hidden_states_TPH))
        expected = torch.stack([reference[sample.sample_id][p.label] for p in engine.points], dim=1)
        assert rel_l2(cap.hidden_states_TPH, expected) <= TOLERANCE
    print(f"\nbatch of {len(batch)} vs alone: worst relative L2 {worst:.1e}")
    assert worst <= TOLERANCE


def test_provenance_is_read_from_the_running_engine(started):
    engine, _, info, _, _, _ = started
    got = engine.info()
    boundaries = [p.boundary for p in engine.points if not p.is_final_norm]
    assert (got.framework, got.framework_version, got.dtype) == ("sglang", "0.5.23", "float32")
    assert got.attention_backend.startswith("torch_native") and got.parallel["tp"] == 1
    assert got.quantization["method"] is None
    assert got.extra["cpu_compat"]["sgl_kernel"].startswith("pipeline stand-in")
    assert [s.point for s in got.points] == [p.label for p in engine.points]
    native = [s.native_id for s in got.points if s.native_id is not None]
    assert got.extra["aux_layer_ids"] == native
    if info.family == "llama":  # id k captures the input of layer k+1
        assert native == [b - 1 for b in boundaries[1:]] and got.extra["layers_to_capture"] == boundaries[1:]
    else:
        assert native == boundaries and got.extra["layers_to_capture"] == boundaries
        assert got.quantization["moe"]["method"] == "UnquantizedFusedMoEMethod"


def test_the_serving_engine_returns_the_same_final_states(started):
    """sglang.Engine.generate(return_hidden_states=True), the serving path, against the in-process runner."""
    engine, path, info, _, _, batch = started
    from bench.sglang_serving_client import ServingEngine

    caps = engine.capture(batch)
    with ServingEngine(str(path), [s.input_ids_T for s in batch], dtype="float32", hidden_states=True) as serving:
        _, served = serving.hidden_states()
    errors = [rel_l2(c.hidden_states_TPH[:, -1], s) for c, s in zip(caps, served)]
    print(f"\n{info.model_type} final_norm, in-process runner vs sglang.Engine: worst relative L2 {max(errors):.1e}")
    assert max(errors) <= TOLERANCE


# --- native id lists passed verbatim: the DeepSeek "+1 only when the first id is 1" quirk, on the real engine -------


@needs_sglang
@pytest.mark.parametrize("model, ids, boundaries", [
    ("tiny-kimi-bf16", [1, 2, 5], [2, 3, 6]),  # SpecForge-style list; the main engine's [0, 1, 4, ...] has no shift
    ("tiny-llama", [1, 2, 4], [2, 3, 5]),  # the main engine's list starts with 0: +1 either way
])
def test_native_lists_starting_with_1_capture_the_documented_layers(tiny_model, model, ids, boundaries):
    path = tiny_model(model)
    (sample,) = samples_of([23], seed=2)
    expected = hf_reference(path, [sample])[sample.sample_id]
    with make_engine(**engine_kwargs(path, boundaries, aux_layer_ids=ids)) as engine:
        (cap,) = engine.capture([sample])
        assert engine.info().extra["layers_to_capture"] == boundaries
    errors = {f"id {i} -> b{b}": rel_l2(cap.hidden_states_TPH[:, j], expected[f"b{b}"])
              for j, (i, b) in enumerate(zip(ids, boundaries))}
    print(f"\n{model} aux ids {ids}: relative L2 vs HF:", {k: f"{v:.1e}" for k, v in errors.items()})
    assert max(errors.values()) <= TOLERANCE


# --- refusals: clear errors, nothing substituted --------------------------------------------------------------------


@needs_sglang
@pytest.mark.parametrize("model", ["tiny-kimi-bf16", "tiny-llama"])
def test_the_last_layer_output_is_refused(tiny_model, model):
    engine = make_engine(**engine_kwargs(tiny_model(model), ["embed", "last", "final_norm"]))
    with pytest.raises(EngineWorkerError, match=r"b\d .*cannot be captured by SGLang 0.5.23.*Nothing else is "
                                                r"substituted"):
        engine.start()
    engine.close()


@needs_sglang
def test_the_int4_checkpoint_is_refused_naming_the_bf16_twin(tiny_model):
    tiny_model("tiny-kimi-bf16")  # the twin the message points to
    engine = make_engine(**engine_kwargs(tiny_model("tiny-kimi-int4"), ["embed", 4, "final_norm"]))
    with pytest.raises(EngineWorkerError, match="no INT4 MoE kernel on CPU.*tiny-kimi-bf16.*model=tiny_kimi_bf16"):
        engine.start()
    engine.close()


@needs_sglang
def test_tensor_parallelism_on_cpu_is_refused(tiny_model):
    kwargs = engine_kwargs(tiny_model("tiny-llama"), ["embed", 2, "final_norm"], tp_size=2, device="cpu")
    engine = make_engine(**kwargs)
    with pytest.raises(EngineWorkerError, match="engine.tp_size=2 with engine.options.device=cpu.*GPUs only"):
        engine.start()
    engine.close()


# --- end to end -----------------------------------------------------------------------------------------------------

UNBUFFERED = {"PYTHONUNBUFFERED": "1"}

@needs_sglang
@pytest.mark.slow
def test_extract_with_sglang_end_to_end(tmp_path, tiny_model):
    out = tmp_path / "run"
    proc = cli("pipeline.extract", "engine=sglang", "model=tiny_kimi_bf16", "engine.dtype=float32", "data.limit=8",
               "capture.points=[embed,1,4,7,final_norm]", f"out_dir={out}", f"hydra.run.dir={tmp_path / 'logs'}",
               env=UNBUFFERED)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "capture points: b0, b1, b4, b7, final_norm" in proc.stdout
    verify = cli("pipeline.verify", str(out), env=UNBUFFERED)
    assert verify.returncode == 0, verify.stderr + verify.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    engine = manifest["provenance"]["engine"]
    assert (engine["framework"], engine["framework_version"], engine["dtype"]) == ("sglang", "0.5.23", "float32")
    assert engine["extra"]["layers_to_capture"] == [0, 1, 4, 7]
    assert manifest["num_samples"] == 8
