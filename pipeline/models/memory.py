"""What a checkpoint's weights take, known before any engine loads them and without reading them.

The weight files' sizes when they are there (the safetensors index's `total_size`, else the files themselves). A
directory with config.json alone (a plan made before the weights are copied) is estimated instead: the model built
on PyTorch's meta device (shapes, no storage) from its text config, each parameter counted in the checkpoint's
dtype, and the layers a compressed-tensors quantization packs (its `Linear` targets, fused experts included, minus
its `ignore` list) counted at its bits plus one scale per group. On Kimi-K2.5 the estimate is 553 GiB, its files
~554 GB: a plan's figure, not an allocator's.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core import jsonfile
from pipeline.models.info import text_config

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1}
INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class WeightSize:
    bytes: int
    how: str  # where the figure comes from, for the plan's line


def weight_size(path: Path) -> WeightSize:
    path = Path(path)
    index = jsonfile.read_lenient(path / INDEX, max_bytes=64 << 20)
    total = (index or {}).get("metadata", {}).get("total_size") if isinstance(index, dict) else None
    if isinstance(total, int) and total > 0:
        return WeightSize(total, f"{INDEX}'s total_size")
    files = [p for p in path.glob("*.safetensors") if p.is_file()] or [p for p in path.glob("*.bin") if p.is_file()]
    if files:
        return WeightSize(sum(p.stat().st_size for p in files), f"the sizes of {len(files)} weight file(s)")
    return _estimated(path)


def _estimated(path: Path) -> WeightSize:
    import torch
    import transformers

    config = jsonfile.read_object(path / "config.json", ValueError, prefix=f"model.path={str(path)!r}: ")
    text = dict(text_config(config))
    quant = config.get("quantization_config") or text.get("quantization_config") or None
    model_type = {"kimi_k2": "deepseek_v3"}.get(text.get("model_type"), text.get("model_type"))
    kept = {k: v for k, v in text.items() if k not in ("model_type", "quantization_config", "auto_map")}
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(model_type, **kept))
    dtype_bytes = DTYPE_BYTES.get(str(text.get("torch_dtype") or text.get("dtype") or "bfloat16"), 2)
    packed = _packing(quant)
    total = 0
    for name, param in model.named_parameters():
        owner = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
        bits = packed(name, owner) if packed is not None else None
        total += param.numel() * dtype_bytes if bits is None else _packed_bytes(param.numel(), *bits)
    what = f"; its {quant.get('quant_method')} packing applied" if packed is not None else ""
    return WeightSize(total, f"estimated from config.json: no weight files in {path}{what}")


def _packed_bytes(numel: int, bits: int, group_size: int) -> int:
    return numel * bits // 8 + (numel // group_size) * 2  # a bf16 scale per group


def _packing(quant: dict[str, Any] | None):
    """(name, module) -> (bits, group_size) for a packed parameter, None for one kept as is; None: nothing packed."""
    if not quant or quant.get("quant_method") != "compressed-tensors":
        return None
    groups = [g for g in (quant.get("config_groups") or {}).values() if isinstance(g, dict)]
    weights = next((g["weights"] for g in groups if "Linear" in (g.get("targets") or []) and g.get("weights")), None)
    if not weights or not weights.get("num_bits") or not weights.get("group_size"):
        return None
    ignore = [re.compile(p[3:]) if p.startswith("re:") else re.compile(re.escape(p) + r"(\..*)?$")
              for p in quant.get("ignore") or []]

    def packed(name: str, module: Any):
        linear = type(module).__name__ == "Linear" or type(module).__name__.endswith("Experts")
        if not linear or not name.rsplit(".", 1)[-1].endswith(("weight", "proj")):
            return None
        return None if any(p.match(name) for p in ignore) else (int(weights["num_bits"]), int(weights["group_size"]))

    return packed
