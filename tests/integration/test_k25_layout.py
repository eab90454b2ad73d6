"""The tiny checkpoints in Kimi-K2.5's layout: the wrapper config, weight names and files of the real one, and the text
model inside equal to the plain DeepSeek-V3 twin (docs/engines.md, "Kimi-K2.5's wrapper on every engine")."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from pipeline.factory import int4
from pipeline.models.hf_text import load_text_model
from pipeline.factory.k25 import REMOTE_CONFIG

pytestmark = [pytest.mark.integration]
WRAPPED = ["tiny-k25-int4", "tiny-k25-bf16"]
PREFIXES = ("language_model.model.", "language_model.lm_head.", "vision_tower.", "mm_projector.")


def _config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(path / "model.safetensors", "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


@pytest.mark.parametrize("name", WRAPPED)
def test_config_json_is_shaped_as_kimi_k25s(tiny_model, name):
    path = tiny_model(name)
    config = _config(path)
    assert config["architectures"] == ["KimiK25ForConditionalGeneration"] and config["model_type"] == "kimi_k25"
    assert config["auto_map"] == {"AutoConfig": "configuration_kimi_k25.KimiK25Config"}
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (3840, 3841, 4095)
    assert config["media_placeholder_token_id"] == 3861 and config["tie_word_embeddings"] is False
    text = config["text_config"]
    assert text["model_type"] == "kimi_k2" and text["num_hidden_layers"] == 61 and text["vocab_size"] == 4096
    assert (text["first_k_dense_replace"], text["topk_method"], text["scoring_func"]) == (1, "noaux_tc", "sigmoid")
    assert text["rope_scaling"] == {"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096,
                                    "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
    assert text["rope_theta"] == 50000.0
    vision = config["vision_config"]
    for spelling in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
        assert vision[spelling] == vision[f"vt_{spelling}"] and vision[spelling] < 100, spelling
    assert config["projection_hidden_size"] == vision["vt_hidden_size"]
    assert vision["text_hidden_size"] == text["hidden_size"]
    assert "media_proc_cfg" in json.loads((path / "preprocessor_config.json").read_text())
    if name.endswith("int4"):  # in both places, as Kimi-K2.5 ships it (vLLM reads the top level only)
        assert config["quantization_config"] == text["quantization_config"] == int4.KIMI_QUANTIZATION_CONFIG
    else:
        assert "quantization_config" not in config and "quantization_config" not in text
    assert (path / "configuration_kimi_k25.py").read_bytes() == REMOTE_CONFIG.read_bytes()  # the project's own


@pytest.mark.parametrize("trust_remote_code", [False, True])
def test_config_loads_with_and_without_remote_code(tiny_model, trust_remote_code):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(tiny_model("tiny-k25-int4")), trust_remote_code=trust_remote_code)
    text = config.get_text_config()
    assert config.model_type == "kimi_k25" and text.num_hidden_layers == 61 and text.hidden_size == 256
    # with remote code it is the checkpoint's own class (configuration_kimi_k25.py), else transformers' native one
    assert (type(config).__module__.startswith("transformers_modules")) == trust_remote_code


def test_weights_use_the_real_names_and_hold_the_text_twins_weights(tiny_model):
    wrapped, int4_tensors = _tensors(tiny_model("tiny-k25-bf16")), _tensors(tiny_model("tiny-k25-int4"))
    text = _tensors(tiny_model("tiny-k25-text-bf16"))
    assert all(k.startswith(PREFIXES) for k in wrapped) and all(k.startswith(PREFIXES) for k in int4_tensors)
    inner = {k.removeprefix("language_model."): v for k, v in wrapped.items() if k.startswith("language_model.")}
    assert inner.keys() == text.keys()
    assert all(torch.equal(inner[k], text[k]) for k in text)
    assert any(k.startswith("vision_tower.encoder.blocks.0.wqkv") for k in wrapped)
    assert {"mm_projector.proj.0.weight", "mm_projector.proj.2.weight"} <= wrapped.keys()
    bias = "language_model.model.layers.1.mlp.gate.e_score_correction_bias"
    assert wrapped[bias].dtype == torch.float32
    packed = [k for k in int4_tensors if k.endswith(".weight_packed")]
    assert len(packed) == 60 * 8 * 3 and all(".mlp.experts." in k for k in packed)  # routed experts only
    assert not any(k.endswith(".weight_packed") and k.startswith(("vision_tower.", "mm_projector.")) for k in packed)


def test_text_model_loads_from_the_wrapper_exactly(tiny_model):
    """The HF reference's loader: the INT4 wrapper's text model (dequantized, float32) equals the plain twin."""
    model, layout = load_text_model(str(tiny_model("tiny-k25-int4")), dtype=torch.float32)
    twin, twin_layout = load_text_model(str(tiny_model("tiny-k25-text-bf16")), dtype=torch.float32)
    assert (layout.wrapper_class, layout.text_class) == ("KimiK25ForConditionalGeneration", "DeepseekV3ForCausalLM")
    assert twin_layout.wrapper_class is None
    state, twin_state = model.state_dict(), twin.state_dict()
    assert state.keys() == twin_state.keys()
    for k in state:
        assert torch.equal(state[k].float(), twin_state[k].float()), k
