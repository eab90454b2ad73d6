"""INT4 twins of built models: a built bf16 checkpoint with some Linears int4 pack-quantized (compressed-tensors).

The twin is made from the base model's own files (the factory builds the base first): the modules its format selects
(`pipeline.factory.int4`) are replaced by `weight_packed` / `weight_scale` / `weight_shape`, every other tensor is
kept byte for byte, config.json gains the format's quantization_config, the tokenizer files are copied, and
`conversion.json` is the base's record plus how it was quantized (every run's provenance copies it).
"""
from __future__ import annotations

# torch and safetensors are imported inside the functions that build: a cached ensure_model() stays cheap.
import json
import shutil
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from pipeline.core.io import sha256_file
from pipeline.models.built import CONVERSION, MARKER

# What shapes the twin's files besides the base model (their versions enter the builder digest).
QUANTIZER_LIBS = ("torch", "compressed-tensors", "safetensors")
_WEIGHTS, _CONFIG = "model.safetensors", "config.json"


@dataclass(frozen=True)
class Int4Twin:
    """The built model `base` with the modules of int4 format `format` (int4.FORMATS) quantized."""

    name: str
    base: str  # the recipe whose built checkpoint is quantized
    format: str
    description: str = ""

    def spec(self) -> dict[str, Any]:
        from pipeline.factory import int4

        return {"name": self.name, "base": self.base, "format": self.format,
                "quantization_config": int4.FORMATS[self.format].config, "description": self.description}


def build_int4_twin(recipe: Int4Twin, base_dir: Path, out_dir: Path) -> None:
    """Writes the twin of the complete built model `base_dir` into the empty directory `out_dir`."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from pipeline.factory import int4

    fmt = int4.FORMATS[recipe.format]
    with safe_open(base_dir / _WEIGHTS, "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    quantized, _ = int4.quantize(tensors, fmt)  # raises unless every packed weight dequantizes exactly in bf16
    weights = out_dir / _WEIGHTS
    save_file({k: v.contiguous() for k, v in sorted(quantized.items())}, str(weights), metadata={"format": "pt"})
    weights.chmod(0o644)  # engines may run as another user
    for src in sorted(base_dir.iterdir()):  # tokenizer, chat template, generation config
        if src.is_file() and src.name not in (MARKER, _WEIGHTS, _CONFIG, CONVERSION):
            shutil.copyfile(src, out_dir / src.name)
    config = json.loads((base_dir / _CONFIG).read_text())
    config["quantization_config"] = int4.quantization_config(fmt)
    _write_json(out_dir / _CONFIG, config)
    num_modules = sum(1 for k in quantized if k.endswith(".weight_packed"))
    _write_json(out_dir / CONVERSION, twin_record(recipe, base_dir, num_modules))


def twin_record(recipe: Int4Twin, base_dir: Path, num_modules: int) -> dict[str, Any]:
    """The base's conversion record (if any) with `quantization`: what was quantized from which file, and by what."""
    from pipeline.factory import int4

    base = base_dir / CONVERSION
    record = json.loads(base.read_text()) if base.is_file() else {}
    weights = int4.quantization_config(int4.FORMATS[recipe.format])["config_groups"]["group_0"]["weights"]
    record["quantization"] = {
        "base": recipe.base, "base_weights_sha256": sha256_file(base_dir / _WEIGHTS),
        "format": f"compressed-tensors pack-quantized ({recipe.format})",
        "modules": f"{int4.FORMATS[recipe.format].what}: {num_modules} modules; every other tensor kept as stored",
        "weights": {k: weights[k] for k in ("num_bits", "type", "symmetric", "strategy", "group_size", "observer")},
        "scales": f"min-max, rounded up to {int4.SCALE_SIGNIFICANT_BITS} significant bits (dequantizes exactly in "
                  "bfloat16)",
        "quantized_by": {lib: metadata.version(lib) for lib in QUANTIZER_LIBS},
    }
    return record



def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


SMOLLM2_W4A16 = Int4Twin(
    name="smollm2-135m-instruct-w4a16",
    base="smollm2-135m-instruct",
    format="dense-w4a16",
    description="smollm2-135m-instruct with every decoder Linear int4 W4A16 (compressed-tensors pack-quantized, "
                "symmetric, group 32: Kimi's expert scheme); embeddings, norms and the tied LM head kept in bfloat16",
)
INT4_TWINS = {SMOLLM2_W4A16.name: SMOLLM2_W4A16}
