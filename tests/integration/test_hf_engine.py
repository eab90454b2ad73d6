"""The HF reference engine on the tiny models: every canonical point equals an independent layer-by-layer computation."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.core.contracts import EngineSpec
from pipeline.engines.registry import engine_class
from pipeline.models.info import read_model_info
from pipeline.points import parse_points
from tests.helpers.reference import layer_by_layer as reference_states
from tests.helpers.samples import rel_l2, samples_of

pytestmark = [pytest.mark.integration]
REFERENCE_OF = {"tiny-kimi-int4": "tiny-kimi-bf16"}


@pytest.fixture(scope="module", params=["tiny-kimi-int4", "tiny-llama"])
def setup(request, tiny_model):
    from transformers import AutoModelForCausalLM

    path = tiny_model(request.param)
    info = read_model_info(path)
    points = parse_points(list(range(info.num_layers + 1)) + ["final_norm"], num_layers=info.num_layers)
    engine = engine_class("hf")(EngineSpec(name="hf", dtype="float32", options={"attn_implementation": "sdpa"}),
                                model_path=str(path), points=points, num_layers=info.num_layers)
    # The reference for the INT4 checkpoint is its dense bf16 twin (the same dequantized weights), run layer by layer:
    # this checks both the capture points and the INT4 load path.
    ref_path = tiny_model(REFERENCE_OF.get(request.param, request.param))
    ref = AutoModelForCausalLM.from_pretrained(ref_path, dtype=torch.float32, attn_implementation="sdpa").eval()
    with engine:
        yield engine, ref, points


def test_every_point_equals_layer_by_layer_reference(setup):
    engine, ref, points = setup
    (sample,) = samples_of([37])
    (cap,) = engine.capture([sample])
    expected = reference_states(ref, sample.input_ids_T)
    assert cap.hidden_states_TPH.shape == (37, len(points), ref.config.hidden_size)
    assert cap.hidden_states_TPH.dtype == torch.float32
    errors = {p.label: rel_l2(cap.hidden_states_TPH[:, i], expected[p.label]) for i, p in enumerate(points)}
    print("relative L2 vs layer-by-layer:", {k: f"{v:.1e}" for k, v in errors.items()})
    assert max(errors.values()) <= 1e-5, errors
    # neighbours differ by far more than the tolerance, so a shifted point could not pass
    assert rel_l2(expected["b2"], expected["b1"]) > 1e-2


def test_batch_with_padding_equals_single_runs(setup):
    engine, _, _ = setup
    batch = samples_of([5, 41, 17, 1, 29], seed=1)
    together = engine.capture(batch)
    for sample, cap in zip(batch, together):
        (alone,) = engine.capture([sample])
        assert cap.sample_id == sample.sample_id
        assert np.array_equal(cap.input_ids_T, sample.input_ids_T)
        assert cap.hidden_states_TPH.shape[0] == sample.num_tokens  # padding stripped
        assert rel_l2(cap.hidden_states_TPH, alone.hidden_states_TPH) <= 1e-5


def test_provenance_read_from_the_loaded_model(setup):
    engine, ref, points = setup
    info = engine.info()
    assert info.framework == "transformers" and info.dtype == "float32"
    assert info.attention_backend == "sdpa"
    assert [s.point for s in info.points] == [p.label for p in points]
    if engine.model.config.model_type == "deepseek_v3":
        assert info.quantization["method"] == "compressed-tensors"
        assert info.quantization["dequantized_at_load"] is True
    else:
        assert info.quantization["method"] is None
