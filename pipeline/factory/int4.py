"""INT4 weights in compressed-tensors' `pack-quantized` format, produced with compressed-tensors' own APIs.

Kimi-K2-Thinking / Kimi-K2.5 ship their routed experts as compressed-tensors `pack-quantized` int4 (symmetric,
group 32) and keep everything else in bf16. The quantization_config below copies the structure of their
config.json. The same scheme applied to every decoder Linear of a dense model is W4A16 (`DENSE_W4A16`). Which modules
a format quantizes is decided by compressed-tensors' own name matching against its `ignore` list, and the build
checks that this selects exactly the modules the format is meant for.
"""
from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
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
# Kimi's weight scheme on every Linear but the LM head: W4A16 (int4 weights, 16-bit activations), as llm-compressor
# writes it for a dense model.
DENSE_W4A16_CONFIG: dict[str, Any] = {**copy.deepcopy(KIMI_QUANTIZATION_CONFIG), "ignore": ["lm_head"]}

ROUTED_EXPERT_RE = re.compile(r"^model\.layers\.\d+\.mlp\.experts\.\d+\.(gate|up|down)_proj$")
DECODER_LINEAR_RE = re.compile(r"^model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)$")
PACKED_SUFFIXES = ("weight_packed", "weight_scale", "weight_shape")
SCALE_SIGNIFICANT_BITS = 5


@dataclass(frozen=True, eq=False)
class Int4Format:
    """A quantization_config and the modules it must select in a checkpoint (names without `.weight`)."""

    name: str
    config: dict[str, Any]
    selects: re.Pattern[str]
    what: str  # the selected modules, in words


KIMI_EXPERTS = Int4Format("kimi-experts", KIMI_QUANTIZATION_CONFIG, ROUTED_EXPERT_RE, "the routed experts")
DENSE_W4A16 = Int4Format("dense-w4a16", DENSE_W4A16_CONFIG, DECODER_LINEAR_RE,
                         "every decoder Linear (self_attn q/k/v/o_proj, mlp gate/up/down_proj)")
FORMATS = {f.name: f for f in (KIMI_EXPERTS, DENSE_W4A16)}


def quantization_config(fmt: Int4Format = KIMI_EXPERTS) -> dict[str, Any]:
    return copy.deepcopy(fmt.config)


@functools.cache
def _scheme(fmt: Int4Format = KIMI_EXPERTS):
    from compressed_tensors.quantization import QuantizationConfig

    # Parsing with compressed-tensors (the library transformers reads it with) checks the dict is a valid config.
    parsed = QuantizationConfig.model_validate(quantization_config(fmt))
    return parsed.config_groups["group_0"]


def _is_linear_module(module_name: str) -> bool:
    # In the checkpoint's own module tree (DeepSeek/Kimi remote code, Llama) the embedding and the MoE router are not
    # nn.Linear, so a "Linear" target never reaches them even though their weights are 2-D.
    return not (module_name.endswith("embed_tokens") or module_name.endswith(".mlp.gate"))


def select_quantized_modules(tensors: Mapping[str, torch.Tensor], fmt: Int4Format = KIMI_EXPERTS) -> list[str]:
    """Module names the quantization_config quantizes: Linear targets minus `ignore`, matched by compressed-tensors."""
    from compressed_tensors.utils.match import match_name

    ignore = fmt.config["ignore"]
    modules = sorted(
        name.removesuffix(".weight")
        for name, tensor in tensors.items()
        if name.endswith(".weight") and tensor.ndim == 2
    )
    return [m for m in modules if _is_linear_module(m) and not any(match_name(m, ign) for ign in ignore)]


def check_selection(selected: Iterable[str], all_names: Iterable[str], fmt: Int4Format = KIMI_EXPERTS) -> None:
    """ValueError unless `selected` is exactly the modules `fmt` is meant for, and there is at least one."""
    selected = set(selected)
    meant = {n.removesuffix(".weight") for n in all_names if fmt.selects.match(n.removesuffix(".weight"))}
    if selected != meant:
        extra, missing = sorted(selected - meant)[:5], sorted(meant - selected)[:5]
        raise ValueError(
            f"quantization_config.ignore={fmt.config['ignore']} must select exactly {fmt.what}; "
            f"it also selects {extra} and misses {missing}"
        )
    if not meant:
        raise ValueError(f"the checkpoint has none of {fmt.what} to quantize (no weight matches {fmt.selects.pattern})")


def compress_weight(weight: torch.Tensor, fmt: Int4Format = KIMI_EXPERTS) -> dict[str, torch.Tensor]:
    """bf16 [out, in] -> {weight_packed int32, weight_scale bf16, weight_shape int64}, min-max group scales."""
    from compressed_tensors.compressors.pack_quantized.base import (
        PackedQuantizationCompressor,
    )
    from compressed_tensors.quantization.utils import calculate_qparams

    scheme = _scheme(fmt)
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


def decompress_weight(packed: Mapping[str, torch.Tensor], dtype: torch.dtype | None = None,
                      fmt: Int4Format = KIMI_EXPERTS) -> torch.Tensor:
    """Dequantized weight; compressed-tensors computes it in the scale's dtype, so `dtype` picks the arithmetic."""
    from compressed_tensors.compressors.pack_quantized.base import (
        PackedQuantizationCompressor,
    )

    state = dict(packed)
    if dtype is not None:
        state["weight_scale"] = state["weight_scale"].to(dtype)
    return PackedQuantizationCompressor.decompress(state, _scheme(fmt))["weight"]


def _dequantize_exactly(module: str, packed: Mapping[str, torch.Tensor], dtype: torch.dtype,
                        fmt: Int4Format) -> torch.Tensor:
    weight = decompress_weight(packed, fmt=fmt)
    exact = decompress_weight(packed, torch.float32, fmt)
    if not torch.equal(weight.float(), exact) or weight.dtype != dtype:
        raise ValueError(
            f"{module}: dequantized weight ({weight.dtype}) differs from its fp32 dequantization by up to "
            f"{(weight.float() - exact).abs().max().item():.3g}; the bf16 twin would not be exact"
        )
    return weight


def quantize(tensors: Mapping[str, torch.Tensor],
             fmt: Int4Format) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Returns (int4 checkpoint tensors, bf16-twin tensors): the twin holds exactly the dequantized int4 weights."""
    selected = select_quantized_modules(tensors, fmt)
    check_selection(selected, tensors, fmt)
    int4, twin = dict(tensors), dict(tensors)
    for module in selected:
        weight = int4.pop(f"{module}.weight")
        packed = compress_weight(weight, fmt)
        for suffix in PACKED_SUFFIXES:
            int4[f"{module}.{suffix}"] = packed[suffix].contiguous()
        twin[f"{module}.weight"] = _dequantize_exactly(module, packed, weight.dtype, fmt).contiguous()
    return int4, twin


def quantize_experts(tensors: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Kimi's format: the routed experts int4, everything else as it was."""
    return quantize(tensors, KIMI_EXPERTS)
