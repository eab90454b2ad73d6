"""Kimi-K2.5's checkpoint layout around a tiny DeepSeek-V3 text model: the multimodal wrapper the real one ships.

The real checkpoint (`KimiK25ForConditionalGeneration`, model_type `kimi_k25`) nests the text model's config under
`text_config`, prefixes its weights with `language_model.`, and carries a MoonViT vision tower and projector with their
own config and `preprocessor_config.json`. Engines meet the wrapper class, not the DeepSeek layers, and that is what the
tiny K2.5 recipes must reproduce (facts: ../shared/KIMI_K25.md). The text weights are the ones `build.py` makes for a
plain DeepSeek-V3 checkpoint, unchanged but for the prefix, so a plain twin holds exactly the same model.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

# Kimi-K2.5's rope (Kimi-K2 had factor 32, beta_fast 1 and 131072 positions).
K25_YARN = {
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "factor": 64.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "original_max_position_embeddings": 4096,
    "type": "yarn",
}
K25_TEXT_OVERRIDES: dict[str, Any] = {"num_hidden_layers": 61, "max_position_embeddings": 262144, "rms_norm_eps": 1e-5}
# The raw text_config model_type of the real checkpoint; transformers and both engines read it as deepseek_v3.
TEXT_MODEL_TYPE = "kimi_k2"
MEDIA_PLACEHOLDER_OFFSET = 21  # <|media_pad|>: the 22nd special id after the BPE ranks, as in Kimi's tokenizer

# A MoonViT small enough to build in no time. Every size is written in both spellings: SGLang's tower and transformers
# read hidden_size/num_hidden_layers/..., SGLang's projector reads vt_hidden_size; with one spelling missing an engine
# builds the real 1152-wide, 27-layer tower and fails on these weights.
VISION_WIDTH, VISION_MLP, VISION_LAYERS, VISION_HEADS, PATCH = 32, 64, 2, 2, 14
POS_EMB = (4, 4, 4)  # height, width, time
MERGE = [2, 2]


def vision_config(text_hidden_size: int) -> dict[str, Any]:
    h, w, t = POS_EMB
    return {
        "model_type": "kimi_k25_vision",
        "patch_size": PATCH,
        "init_pos_emb_height": h, "init_pos_emb_width": w, "init_pos_emb_time": t,
        "pos_emb_height": h, "pos_emb_width": w, "pos_emb_time": t,
        "pos_emb_type": "divided_fixed",
        "vt_hidden_size": VISION_WIDTH, "hidden_size": VISION_WIDTH,
        "vt_intermediate_size": VISION_MLP, "intermediate_size": VISION_MLP,
        "vt_num_attention_heads": VISION_HEADS, "num_attention_heads": VISION_HEADS,
        "vt_num_hidden_layers": VISION_LAYERS, "num_hidden_layers": VISION_LAYERS,
        "merge_kernel_size": MERGE,
        "merge_type": "sd2_tpool",
        "video_attn_type": "spatial_temporal",
        "mm_projector_type": "patchmerger",
        "mm_hidden_size": VISION_WIDTH,
        "projector_hidden_act": "gelu",
        "projector_ln_eps": 1e-5,
        "text_hidden_size": text_hidden_size,
    }


def vision_layout(text_hidden_size: int) -> dict[str, tuple[int, ...]]:
    """MoonViT tower and patch-merger projector tensors under the real checkpoint's names (bf16, never quantized)."""
    d, m = VISION_WIDTH, VISION_MLP
    h, w, _ = POS_EMB
    merged = d * MERGE[0] * MERGE[1]
    shapes: dict[str, tuple[int, ...]] = {
        "vision_tower.patch_embed.proj.weight": (d, 3, PATCH, PATCH),
        "vision_tower.patch_embed.proj.bias": (d,),
        "vision_tower.patch_embed.pos_emb.weight": (h, w, d),
        "vision_tower.encoder.final_layernorm.weight": (d,),
        "vision_tower.encoder.final_layernorm.bias": (d,),
        "mm_projector.pre_norm.weight": (d,),
        "mm_projector.pre_norm.bias": (d,),
        "mm_projector.proj.0.weight": (merged, merged),
        "mm_projector.proj.0.bias": (merged,),
        "mm_projector.proj.2.weight": (text_hidden_size, merged),
        "mm_projector.proj.2.bias": (text_hidden_size,),
    }
    for i in range(VISION_LAYERS):
        block = f"vision_tower.encoder.blocks.{i}"
        shapes.update({
            f"{block}.norm0.weight": (d,), f"{block}.norm0.bias": (d,),
            f"{block}.norm1.weight": (d,), f"{block}.norm1.bias": (d,),
            f"{block}.wqkv.weight": (3 * d, d), f"{block}.wqkv.bias": (3 * d,),
            f"{block}.wo.weight": (d, d), f"{block}.wo.bias": (d,),
            f"{block}.mlp.fc0.weight": (m, d), f"{block}.mlp.fc0.bias": (m,),
            f"{block}.mlp.fc1.weight": (d, m), f"{block}.mlp.fc1.bias": (d,),
        })
    return shapes


def wrap_tensors(text: dict, vision: dict) -> dict:
    """The text model's tensors under `language_model.` (model.* and lm_head.*), plus the vision tensors."""
    wrapped = {f"language_model.{name}": t for name, t in text.items()}
    clash = sorted(set(wrapped) & set(vision))
    if clash:
        raise ValueError(f"vision tensor names clash with the language model's: {clash[:3]}")
    return {**wrapped, **vision}


def wrapper_config(text: dict[str, Any], quantization: dict[str, Any] | None) -> dict[str, Any]:
    """config.json of the wrapper from the plain text model's config.json, shaped as Kimi-K2.5's."""
    text = dict(text)
    # architectures stays: SGLang reads text_config.architectures[0] (shared-expert fusion) and fails on None.
    for key in ("transformers_version", "auto_map"):
        text.pop(key, None)
    text["model_type"] = TEXT_MODEL_TYPE
    if quantization is not None:
        text["quantization_config"] = quantization  # Kimi-K2.5 has it in both places; vLLM reads the top level only
    vocab = int(text["vocab_size"])
    config: dict[str, Any] = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "auto_map": {"AutoConfig": "configuration_kimi_k25.KimiK25Config"},
        "model_type": "kimi_k25",
        "bos_token_id": text.get("bos_token_id"),
        "eos_token_id": text.get("eos_token_id"),
        "pad_token_id": text.get("pad_token_id"),
        "media_placeholder_token_id": vocab - 256 + MEDIA_PLACEHOLDER_OFFSET,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
        "torch_dtype": "bfloat16",
        "projection_hidden_size": VISION_WIDTH,  # transformers' wrapper: the tower's width
        "text_config": text,
        "vision_config": vision_config(int(text["hidden_size"])),
    }
    if quantization is not None:
        config["quantization_config"] = quantization
    return config


def preprocessor_config() -> dict[str, Any]:
    """Kimi-K2.5's media processor settings (vLLM opens this file even for text-only use). No auto_map: the
    processor's remote code is not shipped, and nothing here runs it (the capture is text-only)."""
    return {
        "media_proc_cfg": {
            "patch_size": PATCH,
            "merge_kernel_size": MERGE[0],
            "temporal_merge_kernel_size": POS_EMB[2],
            "image_mean": [0.5, 0.5, 0.5],
            "image_std": [0.5, 0.5, 0.5],
            "in_patch_limit": 64,
            "patch_limit_on_one_side": 8,
        }
    }


REMOTE_CONFIG = Path(__file__).resolve().parent / "remote" / "configuration_kimi_k25.py"


def write_wrapper_files(out_dir: Path, text_config: dict[str, Any], quantization: dict[str, Any] | None) -> None:
    """config.json (replacing the text model's), preprocessor_config.json and the project's configuration module."""
    config = wrapper_config(text_config, quantization)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (out_dir / "preprocessor_config.json").write_text(json.dumps(preprocessor_config(), indent=2) + "\n")
    shutil.copyfile(REMOTE_CONFIG, out_dir / REMOTE_CONFIG.name)
    (out_dir / REMOTE_CONFIG.name).chmod(0o644)
