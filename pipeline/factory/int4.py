"""INT4 routed experts in Kimi-K2's checkpoint format, produced with compressed-tensors' own APIs.

Kimi-K2-Thinking / Kimi-K2.5 ship their routed experts as compressed-tensors `pack-quantized` int4 (symmetric,
group 32) and keep everything else in bf16. The quantization_config below copies the structure of their
config.json; which modules it quantizes is decided by compressed-tensors' own name matching against the `ignore`
list, and the build checks that this selects the routed experts and nothing else.
"""
from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterable, Mapping
from typing import Any

import torch

# Kimi-K2-Thinking's quantization_config, key for key (Kimi-K2.5 adds only vision-tower entries to `ignore`).
KIMI_QUANTIZATION_CONFIG: dict[str, Any] = {
    "config_groups": {
        "group_0": {
            "input_activations": None,
            "output_activations": None,
            "targets": ["Linear"],
            "weights": {
                "actorder": None,
                "block_structure": None,
                "dynamic": False,
                "group_size": 32,
                "num_bits": 4,
                "observer": "minmax",
                "observer_kwargs": {},
                "strategy": "group",
                "symmetric": True,
                "type": "int",
            },
        }
    },
    "format": "pack-quantized",
    "ignore": [
        "lm_head",
        "re:.*self_attn.*",
        "re:.*shared_experts.*",
        "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
    ],
    "kv_cache_scheme": None,
    "quant_method": "compressed-tensors",
    "quantization_status": "compressed",
}

ROUTED_EXPERT_RE = re.compile(r"^model\.layers\.\d+\.mlp\.experts\.\d+\.(gate|up|down)_proj$")
PACKED_SUFFIXES = ("weight_packed", "weight_scale", "weight_shape")
SCALE_SIGNIFICANT_BITS = 5


def quantization_config() -> dict[str, Any]:
    return copy.deepcopy(KIMI_QUANTIZATION_CONFIG)


@functools.cache
def _scheme():
    from compressed_tensors.quantization import QuantizationConfig

    # Parsing with compressed-tensors (the library transformers reads it with) checks the dict is a valid config.
    parsed = QuantizationConfig.model_validate(quantization_config())
    return parsed.config_groups["group_0"]


def _is_linear_module(module_name: str) -> bool:
    # In the checkpoint's own module tree (DeepSeek/Kimi remote code) the embedding and the MoE router are not
    # nn.Linear, so a "Linear" target never reaches them even though their weights are 2-D.
    return not (module_name.endswith("embed_tokens") or module_name.endswith(".mlp.gate"))


def select_quantized_modules(tensors: Mapping[str, torch.Tensor]) -> list[str]:
    """Module names the quantization_config quantizes: Linear targets minus `ignore`, matched by compressed-tensors."""
    from compressed_tensors.utils.match import match_name

    ignore = KIMI_QUANTIZATION_CONFIG["ignore"]
    modules = sorted(
        name.removesuffix(".weight")
        for name, tensor in tensors.items()
        if name.endswith(".weight") and tensor.ndim == 2
    )
    return [m for m in modules if _is_linear_module(m) and not any(match_name(m, ign) for ign in ignore)]


def check_selects_routed_experts_only(selected: Iterable[str], all_names: Iterable[str]) -> None:
    selected = set(selected)
    experts = {n.removesuffix(".weight") for n in all_names if ROUTED_EXPERT_RE.match(n.removesuffix(".weight"))}
    if selected != experts:
        extra, missing = sorted(selected - experts)[:5], sorted(experts - selected)[:5]
        raise ValueError(
            f"quantization_config.ignore={KIMI_QUANTIZATION_CONFIG['ignore']} must select exactly the routed experts; "
            f"it also selects {extra} and misses {missing}"
        )
    if not experts:
        raise ValueError("the checkpoint has no routed expert weights to quantize (no mlp.experts.N.*_proj.weight)")


def compress_weight(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """bf16 [out, in] -> {weight_packed int32, weight_scale bf16, weight_shape int64}, min-max group scales."""
    from compressed_tensors.compressors.pack_quantized.base import (
        PackedQuantizationCompressor,
    )
    from compressed_tensors.quantization.utils import calculate_qparams

    scheme = _scheme()
    group = scheme.weights.group_size
    out_features, in_features = weight.shape
    if in_features % group:
        raise ValueError(f"weight in_features={in_features} is not a multiple of group_size={group}")
    grouped = weight.reshape(out_features, in_features // group, group)
    # What llm-compressor's "minmax" observer computes for the group strategy, handed to compressed-tensors.
    # (min/max taken in fp32, which is exact and much faster than bf16 reductions on CPU.)
    lo, hi = (r.to(weight.dtype) for r in (grouped.float().amin(dim=-1), grouped.float().amax(dim=-1)))
    scale, zero_point = calculate_qparams(lo, hi, scheme.weights)
    scale = _round_up_significand(scale, SCALE_SIGNIFICANT_BITS)
    state = {"weight": weight, "weight_scale": scale, "weight_zero_point": zero_point}
    return dict(PackedQuantizationCompressor.compress(state, scheme))


def _round_up_significand(scale: torch.Tensor, bits: int) -> torch.Tensor:
    """Scales with `bits` significant bits, rounded up (so no extra clipping), in the original dtype.

    An int4 value has at most 3 significant bits, so with 5-bit scales every dequantized weight q * scale fits
    bf16's 8 bits exactly: engines that dequantize in bf16, fp16 or fp32 all get the bf16 twin's weights."""
    mantissa, exponent = torch.frexp(scale.float())
    rounded = torch.ldexp(torch.ceil(mantissa * 2**bits) / 2**bits, exponent)
    return rounded.to(scale.dtype)


def decompress_weight(packed: Mapping[str, torch.Tensor], dtype: torch.dtype | None = None) -> torch.Tensor:
    """Dequantized weight; compressed-tensors computes it in the scale's dtype, so `dtype` picks the arithmetic."""
    from compressed_tensors.compressors.pack_quantized.base import (
        PackedQuantizationCompressor,
    )

    state = dict(packed)
    if dtype is not None:
        state["weight_scale"] = state["weight_scale"].to(dtype)
    return PackedQuantizationCompressor.decompress(state, _scheme())["weight"]


def _dequantize_exactly(module: str, packed: Mapping[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    weight = decompress_weight(packed)
    exact = decompress_weight(packed, torch.float32)
    if not torch.equal(weight.float(), exact) or weight.dtype != dtype:
        raise ValueError(
            f"{module}: dequantized weight ({weight.dtype}) differs from its fp32 dequantization by up to "
            f"{(weight.float() - exact).abs().max().item():.3g}; the bf16 twin would not be exact"
        )
    return weight


def quantize_experts(tensors: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Returns (int4 checkpoint tensors, bf16-twin tensors): the twin holds exactly the dequantized int4 experts."""
    selected = select_quantized_modules(tensors)
    check_selects_routed_experts_only(selected, tensors)
    int4, twin = dict(tensors), dict(tensors)
    for module in selected:
        weight = int4.pop(f"{module}.weight")
        packed = compress_weight(weight)
        for suffix in PACKED_SUFFIXES:
            int4[f"{module}.{suffix}"] = packed[suffix].contiguous()
        twin[f"{module}.weight"] = _dequantize_exactly(module, packed, weight.dtype).contiguous()
    return int4, twin
