"""Builds one tiny model directory: config, seeded weights, tokenizer, and (for Kimi) the INT4 expert format.

The Kimi-architecture recipes share one set of base weights (same seed, same tensor names), so the INT4 model, its
bf16 twin and the default-rope variant differ only where they are meant to; the Kimi-K2.5 recipes (61 layers) wrap the
same kind of text model in K2.5's multimodal layout (`pipeline.factory.k25`), and their plain twin holds the very same
text weights.
"""
from __future__ import annotations

# torch, numpy and transformers are imported inside the functions that build: a cached ensure_model() stays cheap.
import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.factory import k25
from pipeline.factory.weights import LOGIT_SCALE, SEED, init_tensor

VOCAB_SIZE = 4096

# Kimi-K2's config.json keys, scaled down. Kept as in Kimi: kv_lora_rank 512 and qk_rope_head_dim 64 (the only MLA
# shape vLLM's CPU backend runs), the routing (sigmoid, noaux_tc, 1 group, norm_topk_prob, scaling 2.827) and the
# yarn rope (factor 32 over 4096 original positions, beta 1/1, mscale 1/1).
KIMI_YARN = {
    "beta_fast": 1.0,
    "beta_slow": 1.0,
    "factor": 32.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "original_max_position_embeddings": 4096,
    "type": "yarn",
}
KIMI_ROPE_THETA = 50000.0
KIMI_TINY: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 256,
    "intermediate_size": 768,
    "moe_intermediate_size": 128,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": 128,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 64,
    "qk_rope_head_dim": 64,
    "v_head_dim": 64,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "n_group": 1,
    "topk_group": 1,
    "routed_scaling_factor": 2.827,
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "norm_topk_prob": True,
    "aux_loss_alpha": 0.001,
    "seq_aux": True,
    "ep_size": 1,
    "num_nextn_predict_layers": 0,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "use_cache": True,
}
LLAMA_TINY: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "initializer_range": 0.02,
    "use_cache": True,
}


@dataclass(frozen=True, kw_only=True)
class Recipe:
    name: str
    family: str  # "kimi" (DeepSeek-V3 text model) or "llama"
    # kimi only: "yarn" (Kimi-K2's values), "k25" (Kimi-K2.5's yarn, its 61 layers and positions) or "default"
    rope: str = "yarn"
    int4_experts: bool = False
    # kimi only: "causal_lm" (a plain DeepseekV3ForCausalLM checkpoint) or "kimi_k25" (Kimi-K2.5's multimodal
    # wrapper around the same text model: pipeline.factory.k25)
    layout: str = "causal_lm"
    # "bpe" (pipeline.factory.tokenizer: a fast tokenizer, Kimi-K2's special tokens) or "kimi" (Kimi-K2.5's own
    # shape: a remote-code tiktoken tokenizer, pipeline.factory.kimi_tokenizer; loading it needs trust_remote_code)
    tokenizer: str = "bpe"
    # kimi only: fewer decoder layers than the rope's model (the K2.5 layout with 8 layers: the embedded default,
    # where 61 tiny random MoE layers are slow and chaotic in bf16)
    num_layers: int | None = None
    description: str = ""

    def spec(self) -> dict[str, Any]:
        """Everything that decides the files, for the builder digest."""
        base = KIMI_TINY if self.family == "kimi" else LLAMA_TINY
        return {"recipe": self.__dict__, "config": base, "yarn": KIMI_YARN, "seed": SEED, "logit_scale": LOGIT_SCALE,
                "k25": {"yarn": k25.K25_YARN, "text": k25.K25_TEXT_OVERRIDES, "vision": k25.vision_config(0)}}

    def text_config(self) -> dict[str, Any]:
        if self.family != "kimi":
            return dict(LLAMA_TINY)
        config = dict(KIMI_TINY)
        if self.rope == "k25":
            config.update(k25.K25_TEXT_OVERRIDES)
        if self.num_layers is not None:
            config["num_hidden_layers"] = self.num_layers
        return config

    def rope_scaling(self) -> dict[str, Any] | None:
        if self.family != "kimi" or self.rope == "default":
            return None
        if self.rope == "k25":
            return dict(k25.K25_YARN)
        return dict(KIMI_YARN)


def write_tokenizer(recipe: Recipe, out_dir: Path) -> None:
    """The one place the tiny models' tokenizer is written."""
    if recipe.tokenizer == "kimi":
        from pipeline.factory.kimi_tokenizer import write_kimi_tokenizer

        write_kimi_tokenizer(out_dir)
    else:
        from pipeline.factory.tokenizer import build_tokenizer

        build_tokenizer(out_dir)


def build_model_dir(recipe: Recipe, out_dir: Path) -> None:
    """Writes the complete model (minus the completion marker) into the empty directory out_dir."""
    _check_recipe(recipe)
    write_tokenizer(recipe, out_dir)
    token_ids = _special_token_ids(out_dir, trust_remote_code=recipe.tokenizer == "kimi")
    config = _hf_config(recipe, token_ids)
    names_shapes = _checkpoint_layout(config, out_dir)
    tensors = {name: init_tensor(name, shape) for name, shape in names_shapes.items()}
    if recipe.family == "kimi":
        tensors = _kimi_tensors(recipe, tensors)
    _patch_config_json(recipe, out_dir / "config.json")
    if recipe.layout == "kimi_k25":
        tensors = _wrap_k25(recipe, tensors, out_dir)
    _save_safetensors(tensors, out_dir / "model.safetensors")


def _check_recipe(recipe: Recipe) -> None:
    if recipe.tokenizer not in ("bpe", "kimi"):
        raise ValueError(f"recipe {recipe.name!r}: tokenizer={recipe.tokenizer!r} is not one of ['bpe', 'kimi']")
    if recipe.rope not in ("yarn", "k25", "default"):
        raise ValueError(f"recipe {recipe.name!r}: rope={recipe.rope!r} is not one of ['yarn', 'k25', 'default']")
    if recipe.layout not in ("causal_lm", "kimi_k25") or (recipe.layout == "kimi_k25" and recipe.family != "kimi"):
        raise ValueError(f"recipe {recipe.name!r}: layout={recipe.layout!r} (family {recipe.family!r}): kimi_k25 "
                         f"wraps a kimi-family text model; otherwise causal_lm")


def _wrap_k25(recipe: Recipe, text_tensors: dict, out_dir: Path) -> dict:
    text_config = json.loads((out_dir / "config.json").read_text())
    hidden = int(text_config["hidden_size"])
    vision = {name: init_tensor(name, shape) for name, shape in k25.vision_layout(hidden).items()}
    k25.write_wrapper_files(out_dir, text_config, text_config.pop("quantization_config", None))
    return k25.wrap_tensors(text_tensors, vision)


def _special_token_ids(model_dir: Path, *, trust_remote_code: bool) -> dict[str, int | None]:
    from transformers import AutoTokenizer

    # The remote code here is this project's own tokenization_kimi.py, just written into model_dir.
    tok = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=trust_remote_code)
    if len(tok) > VOCAB_SIZE:
        raise ValueError(f"tokenizer in {model_dir} has {len(tok)} tokens; the tiny models' vocab_size is {VOCAB_SIZE}")
    ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    if ids["eos_token_id"] is None:
        raise ValueError(f"tokenizer in {model_dir} defines no eos token (eos_token={tok.eos_token!r})")
    return ids


def _hf_config(recipe: Recipe, token_ids: dict[str, int | None]):
    if recipe.family == "kimi":
        from transformers import DeepseekV3Config

        rope = recipe.rope_scaling() or {"rope_type": "default"}
        rope["rope_theta"] = KIMI_ROPE_THETA
        return DeepseekV3Config(**recipe.text_config(), rope_parameters=rope, **token_ids)
    if recipe.family == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(**recipe.text_config(), **token_ids)
    raise ValueError(f"recipe {recipe.name!r}: family={recipe.family!r} is not one of ['kimi', 'llama']")


def _checkpoint_layout(config, out_dir: Path) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes exactly as transformers saves this architecture (per-expert MoE names included).

    save_pretrained also writes config.json and generation_config.json, with the special-token ids in both."""
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    torch.manual_seed(SEED)  # the throwaway init below is never stored, but keep the build free of global state
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    # Scratch inside out_dir: a killed build leaves it in the building directory, which the next build removes.
    with tempfile.TemporaryDirectory(dir=out_dir) as scratch, _quiet_progress_bars():
        model.save_pretrained(scratch)
        with safe_open(Path(scratch) / "model.safetensors", "pt") as f:
            layout = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
        for name in ("config.json", "generation_config.json"):
            (out_dir / name).write_bytes((Path(scratch) / name).read_bytes())
    return layout


@contextmanager
def _quiet_progress_bars() -> Iterator[None]:
    # save_pretrained draws a progress bar on stderr; the CLI's output is one line per model.
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _kimi_tensors(recipe: Recipe, tensors: dict) -> dict:
    from pipeline.factory.int4 import quantize_experts

    int4, twin = quantize_experts(tensors)
    return int4 if recipe.int4_experts else twin


def _save_safetensors(tensors: dict, path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in sorted(tensors.items())}, str(path), metadata={"format": "pt"})
    path.chmod(0o644)  # safetensors creates it private; engines may run as another user


def _patch_config_json(recipe: Recipe, path: Path) -> None:
    config = json.loads(path.read_text())
    config["torch_dtype"] = "bfloat16"  # Kimi's config.json key (pre-5 readers); transformers 5 writes "dtype"
    # transformers 5 reads rope_parameters; the legacy top-level rope_theta / rope_scaling (Kimi's own keys) are
    # what older readers look for. Both forms are written and say the same thing.
    config["rope_theta"] = config["rope_parameters"]["rope_theta"]
    config["rope_scaling"] = recipe.rope_scaling()
    if recipe.family == "kimi":
        config["moe_layer_freq"] = KIMI_TINY["moe_layer_freq"]  # SGLang reads it; transformers may drop it
        if recipe.int4_experts:
            from pipeline.factory.int4 import quantization_config

            config["quantization_config"] = quantization_config()
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
