"""The INT4 twin of the real model (smollm2-135m-instruct-w4a16): every decoder Linear packed W4A16 in
compressed-tensors format, the rest of the bf16 model kept, and HF running it through compressed-tensors.

Both checkpoints are built once per machine (the setup script builds every recipe); nothing here rebuilds them.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from pipeline.core.contracts import EngineSpec
from pipeline.engines.process.remote import EngineWorkerError
from pipeline.engines.registry import make_engine
from pipeline.factory import int4
from pipeline.points import parse_points
from tests.helpers.markers import needs_sglang

pytestmark = [pytest.mark.integration]

BASE, TWIN = "smollm2-135m-instruct", "smollm2-135m-instruct-w4a16"
NUM_LAYERS, LINEARS_PER_LAYER = 30, 7  # q/k/v/o_proj, gate/up/down_proj
# Next-token (argmax) agreement of the W4A16 twin with the bf16 model, both computed in float32, over the 230
# teacher-forced positions below: measured 0.639 (147 of 230; round-to-nearest int4 costs a 135M model that much,
# ~10% relative error per weight matrix). The bound leaves room for another CPU's float32 rounding.
MIN_TOP1 = 0.55
CONVERSATIONS = Path(__file__).resolve().parents[2] / "pipeline" / "data" / "bundled" / "conversations.jsonl"


@pytest.fixture(scope="module")
def dirs(tiny_model) -> tuple[Path, Path]:
    return tiny_model(BASE), tiny_model(TWIN)


def _tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    with safe_open(model_dir / "model.safetensors", "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _packed(tensors: dict[str, torch.Tensor], module: str) -> dict[str, torch.Tensor]:
    return {s: tensors[f"{module}.{s}"] for s in int4.PACKED_SUFFIXES}


def _probe_ids(model_dir: Path) -> torch.Tensor:
    """The first two bundled conversations through the model's own chat template, as one batch of one."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    lines = CONVERSATIONS.read_text().splitlines()[:2]
    messages = [m for line in lines for m in json.loads(line)["messages"]]
    ids = tok.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
    return torch.tensor([ids[:230]])


def _load_fp32(model_dir: Path):
    from pipeline.models.hf_text import load_text_model  # what the HF engine loads with

    return load_text_model(str(model_dir), dtype=torch.float32)[0].eval()


def test_twin_packs_every_decoder_linear_and_keeps_the_rest(dirs):
    base_dir, twin_dir = dirs
    base, twin = _tensors(base_dir), _tensors(twin_dir)
    packed = {k.removesuffix(".weight_packed") for k in twin if k.endswith(".weight_packed")}
    linears = {k.removesuffix(".weight") for k in base if int4.DECODER_LINEAR_RE.match(k.removesuffix(".weight"))}
    assert packed == linears and len(packed) == NUM_LAYERS * LINEARS_PER_LAYER
    for module in packed:
        out_features, in_features = base[f"{module}.weight"].shape
        assert f"{module}.weight" not in twin
        assert twin[f"{module}.weight_packed"].dtype == torch.int32
        assert twin[f"{module}.weight_packed"].shape == (out_features, in_features // 8)
        assert twin[f"{module}.weight_scale"].dtype == torch.bfloat16
        assert twin[f"{module}.weight_scale"].shape == (out_features, in_features // 32)
        assert twin[f"{module}.weight_shape"].tolist() == [out_features, in_features]
    kept = {k for k in twin if not k.endswith(int4.PACKED_SUFFIXES)}
    assert kept == {k for k in base if k.removesuffix(".weight") not in packed}
    assert "model.embed_tokens.weight" in kept and "model.norm.weight" in kept and "lm_head.weight" not in kept
    for k in kept:  # embeddings (the tied LM head) and norms: the bf16 model's tensors, untouched
        assert twin[k].dtype == base[k].dtype == torch.bfloat16 and torch.equal(twin[k], base[k]), k


def test_twin_config_is_compressed_tensors_w4a16_with_kimis_scheme(dirs):
    from compressed_tensors.quantization import QuantizationConfig

    base_dir, twin_dir = dirs
    base, twin = (json.loads((d / "config.json").read_text()) for d in dirs)
    qc = twin.pop("quantization_config")
    assert twin == base  # nothing else differs from the bf16 model's config
    assert (qc["quant_method"], qc["format"], qc["quantization_status"]) == (
        "compressed-tensors", "pack-quantized", "compressed")
    assert qc["ignore"] == ["lm_head"] and qc["config_groups"]["group_0"]["targets"] == ["Linear"]
    weights = qc["config_groups"]["group_0"]["weights"]
    assert weights == int4.KIMI_QUANTIZATION_CONFIG["config_groups"]["group_0"]["weights"]
    assert (weights["num_bits"], weights["symmetric"], weights["strategy"], weights["group_size"]) == (
        4, True, "group", 32)
    QuantizationConfig.model_validate(qc)
    record = json.loads((twin_dir / "conversion.json").read_text())
    assert record["source"] == json.loads((base_dir / "conversion.json").read_text())["source"]
    base_sha = hashlib.sha256((base_dir / "model.safetensors").read_bytes()).hexdigest()
    assert record["quantization"]["base"] == BASE and record["quantization"]["base_weights_sha256"] == base_sha


def test_hf_runs_the_twin_on_exactly_its_dequantized_weights(dirs):
    base_dir, twin_dir = dirs
    ids = _probe_ids(base_dir)
    twin_model, base_model = _load_fp32(twin_dir), _load_fp32(base_dir)
    with torch.no_grad():
        twin_logits, base_logits = twin_model(ids).logits[0], base_model(ids).logits[0]
    # compressed-tensors holds the packed weights and decompresses them on the first forward (transformers 5.19).
    stored = _tensors(twin_dir)
    modules = dict(twin_model.named_modules())
    linears = sorted(k.removesuffix(".weight_packed") for k in stored if k.endswith(".weight_packed"))
    for name in linears:
        module = modules[name]
        assert module.quantization_scheme.weights.group_size == 32, name  # attached by compressed-tensors
        assert module.weight.dtype == torch.float32, name
        # compressed-tensors' own bf16 dequantization of the stored tensors (the build checked it equals fp32's)
        expected = int4.decompress_weight(_packed(stored, name), fmt=int4.DENSE_W4A16).float()
        assert torch.equal(module.weight, expected), name
        assert not torch.equal(module.weight, base_model.get_submodule(name).weight), name  # really int4
    assert torch.isfinite(twin_logits).all()
    top1 = (twin_logits.argmax(-1) == base_logits.argmax(-1)).float().mean().item()
    assert MIN_TOP1 <= top1 < 1.0, f"top-1 agreement with the bf16 model {top1:.3f}"


@needs_sglang
def test_sglang_refuses_the_twin_on_cpu_naming_the_dense_cause(dirs):
    # SGLang 0.5.23's compressed-tensors Linear scheme asks for a CUDA capability while loading
    # (docs/engines.md#int4-w4a16-dense-on-cpu): the adapter says so before SGLang starts, and names what runs.
    spec = EngineSpec(name="sglang", dtype="bfloat16", options={"device": "cpu"})
    engine = make_engine(spec, model_path=str(dirs[1]), points=parse_points(["embed", 2, "final_norm"], num_layers=30),
                         num_layers=NUM_LAYERS)
    with pytest.raises(EngineWorkerError, match="dense WNA16 Linear scheme.*model=smollm2.*engine=vllm"):
        engine.start()
    engine.close()
