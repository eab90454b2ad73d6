"""An EAGLE-3 draft checkpoint as trainers write it and servers read it: config.json + *.safetensors.

Three schemas, read from the released code that writes or reads them:
- `specforge`: SpecForge 0.2.0 / SGLang `LlamaForCausalLMEagle3` (a Llama config with `architectures
  ["LlamaForCausalLMEagle3"]`, `draft_vocab_size`, optional `target_hidden_size`, and `eagle_config
  {eagle_aux_hidden_state_layer_ids, use_aux_hidden_state}`); weights `midlayer.*` (or `layers.0.*`), `fc.weight`,
  `norm.weight`, `lm_head.weight`, optional `embed_tokens.weight`, `d2t` (draft id -> target id offset), `t2d`.
- `speculators`: speculators 0.9.0 `Eagle3SpeculatorConfig` (`speculators_model_type "eagle3"`,
  `transformer_layer_config {...}`, top-level `eagle_aux_hidden_state_layer_ids`, `draft_vocab_size`,
  `target_hidden_size`, `speculators_config.verifier`); weights `layers.0.*`, `fc.weight`, ... (vLLM converts this
  config itself: vllm/transformers_utils/configs/speculators/algos.py).
- `mla`: SGLang 0.5.23 `Eagle3DeepseekV2ForCausalLM` (sglang/srt/models/kimi_k25_eagle3.py, the
  `kimi-k2.5-eagle3-mla` layout; vLLM 0.32 has the same class in deepseek_eagle3.py): a one-layer DeepSeek-V2 config
  (MLA: `q_lora_rank`, `kv_lora_rank`, ...) plus `eagle_config`; weights `layers.0.*` or `midlayer.*` with MLA
  projections (`self_attn.q_a_proj`, `kv_a_proj_with_mqa`, `kv_b_proj`, ...), `fc`, `norm`, `lm_head`, `d2t`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from pipeline.core.cli import UsageError
from pipeline.core.jsonfile import Fields, read_fields

FORMATS = ("specforge", "speculators", "mla")
_VOCAB_MAPS = ("d2t", "t2d")
_SCAN_ELEMENTS = 1 << 24  # the finiteness scan reads a tensor this many elements at a time (memory stays bounded)
_FLOATS = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64}


class DraftError(UsageError, ValueError):
    """A draft directory that cannot be read: named file missing, not JSON, a config field of the wrong type, or no
    EAGLE-3 draft at all."""


@dataclass(frozen=True)
class Tensor:
    shape: tuple[int, ...]
    dtype: str
    nan: int = 0  # NaN elements (floating-point tensors)
    inf: int = 0  # +-inf elements

    @property
    def finite(self) -> bool:
        return not (self.nan or self.inf)


@dataclass(kw_only=True)
class Draft:
    """A draft checkpoint: every config field the doctor uses, read by type (DraftError names a wrong one); a check
    that needs another field adds it here, read in `read_draft`."""
    path: Path
    format: str
    architecture: str
    hidden_size: int  # the decoder layer's (speculators nests its config in transformer_layer_config)
    vocab_size: int | None  # the target vocabulary the draft maps into
    draft_vocab_size: int | None
    target_hidden_size: int | None  # None: the draft's hidden size
    eagle_config_aux_ids: list[int] | None  # `eagle_config.eagle_aux_hidden_state_layer_ids` (None: absent or empty)
    top_level_aux_ids: list[int] | None  # `eagle_aux_hidden_state_layer_ids` at the top level (speculators, vLLM)
    use_aux_hidden_state: bool | None  # `eagle_config.use_aux_hidden_state` (None: absent, the servers' true)
    eagle_config_from: str  # where the eagle_config a server reads sits in config.json, in words
    num_aux_hidden_states: int | None  # the decoder layer config's explicit aux count
    norm_output: bool | None  # `norm_output` where the draft's format keeps it (None: absent)
    norm_output_from: str  # where it was read, in words
    norm_before_residual: bool | None  # top-level `norm_before_residual` (None: absent)
    tensors: dict[str, Tensor]
    vocab_maps: dict[str, torch.Tensor] = field(default_factory=dict)  # d2t / t2d, loaded (small)

    @property
    def fc_in(self) -> int | None:
        fc = self.tensors.get("fc.weight")
        return fc.shape[1] if fc is not None and len(fc.shape) == 2 else None

    @property
    def input_width(self) -> int:
        return self.target_hidden_size or self.hidden_size

    @property
    def non_finite(self) -> dict[str, Tensor]:
        """The tensors holding NaN or inf, by name."""
        return {name: t for name, t in self.tensors.items() if not t.finite}


def schema_of(config: Fields) -> str:
    archs = config.list("architectures", "str", optional=True) or []
    model_type = config.str("speculators_model_type", optional=True)
    if model_type is not None or config.obj("speculators_config", optional=True) is not None:
        if (model_type or "eagle3") != "eagle3":
            raise DraftError(f"speculators_model_type {model_type!r} is not an EAGLE-3 draft (the doctor reads eagle3)")
        return "speculators"
    if any("Deepseek" in a and "Eagle3" in a for a in archs) or config.has("kv_lora_rank"):
        return "mla"
    if any("Eagle3" in a for a in archs) or config.has("eagle_config") or config.has("draft_vocab_size"):
        return "specforge"
    raise DraftError(f"config.json architectures {archs} is no EAGLE-3 draft the doctor knows: "
                     "LlamaForCausalLMEagle3 (SpecForge/SGLang), Eagle3Speculator (speculators), "
                     "Eagle3DeepseekV2ForCausalLM (MLA)")


def _count_non_finite(f: Any, name: str, shape: tuple[int, ...], dtype: str) -> tuple[int, int]:
    """(NaN, inf) elements of a floating-point tensor, read a bounded slice at a time; (0, 0) for other dtypes."""
    if not (dtype in _FLOATS or dtype.startswith("F8")):
        return 0, 0
    numel = 1
    for n in shape:
        numel *= n
    if not numel:
        return 0, 0
    rows = shape[0] if shape else 1
    step = max(1, _SCAN_ELEMENTS // max(1, numel // rows))
    nan = inf = 0
    for begin in range(0, rows, step):
        x = f.get_tensor(name) if not shape or step >= rows else f.get_slice(name)[begin:begin + step]
        x = x if x.dtype in _FLOATS.values() else x.float()  # float8: isnan is float32's (e4m3 max 448 fits)
        nan, inf = nan + int(torch.isnan(x).sum()), inf + int(torch.isinf(x).sum())
        if not shape or step >= rows:
            break
    return nan, inf


def _tensors(path: Path) -> tuple[dict[str, Tensor], dict[str, torch.Tensor]]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise DraftError(f"{path} holds no *.safetensors weights")
    tensors, maps = {}, {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    piece = f.get_slice(name)
                    shape, dtype = tuple(piece.get_shape()), str(piece.get_dtype())
                    tensors[name] = Tensor(shape, dtype, *_count_non_finite(f, name, shape, dtype))
                    if name.rsplit(".", 1)[-1] in _VOCAB_MAPS:
                        maps[name.rsplit(".", 1)[-1]] = f.get_tensor(name)
        except Exception as exc:  # safetensors raises its own error types for a damaged header
            raise DraftError(f"{file} is not a readable safetensors file: {exc}") from None
    return tensors, maps


def _aux_ids(fields: Fields | None) -> list[int] | None:
    ids = fields.list("eagle_aux_hidden_state_layer_ids", "int", optional=True) if fields is not None else None
    return list(ids) if ids else None


def _norm_output(config: Fields, fmt: str) -> dict[str, Any]:
    """speculators 0.9 keeps `norm_output` at the top level of Eagle3SpeculatorConfig (models/eagle3/config.py), and
    vLLM 0.32's converter copies the top-level value over transformer_layer_config's (speculators/algos.py
    update_eagle3: config_dict.get("norm_output", False)): a nested one is read by neither. SpecForge/SGLang Llama
    and the MLA draft are one flat config, read at the top level (getattr(config, "norm_output", ...))."""
    value = config.bool("norm_output", optional=True)
    if fmt != "speculators":
        return {"norm_output": value, "norm_output_from": "config.json norm_output"}
    nested = config.obj("transformer_layer_config").bool("norm_output", optional=True)
    where = "config.json norm_output (top level, where speculators and vLLM read it)"
    if nested is not None and nested != value:
        where += f"; transformer_layer_config.norm_output {str(nested).lower()} is read by neither"
    return {"norm_output": value, "norm_output_from": where}


def read_draft(path: Path) -> Draft:
    path = Path(path)
    if not path.is_dir():
        raise DraftError(f"draft directory {path} does not exist")
    config = read_fields(path / "config.json", DraftError,
                         missing_hint=" (a draft directory holds config.json and *.safetensors)")
    fmt = schema_of(config)
    layer = config.obj("transformer_layer_config") if fmt == "speculators" else config
    hidden_size = layer.int("hidden_size", minimum=1)
    # vLLM builds a speculators draft from its transformer_layer_config (speculators/base.py
    # extract_transformers_pre_trained_config): an eagle_config nested there reaches the server, a top-level one not
    eagle_from = "transformer_layer_config.eagle_config" if fmt == "speculators" else "eagle_config"
    eagle = (layer if fmt == "speculators" else config).obj("eagle_config", optional=True)
    archs = config.list("architectures", "str", optional=True) or ["?"]
    typed = dict(vocab_size=layer.int("vocab_size", optional=True, minimum=1),
                 draft_vocab_size=config.int("draft_vocab_size", optional=True, minimum=1),
                 target_hidden_size=config.int("target_hidden_size", optional=True, minimum=1),
                 eagle_config_aux_ids=_aux_ids(eagle), top_level_aux_ids=_aux_ids(config),
                 use_aux_hidden_state=eagle.bool("use_aux_hidden_state", optional=True) if eagle else None,
                 eagle_config_from=eagle_from,
                 num_aux_hidden_states=layer.int("num_aux_hidden_states", optional=True, minimum=1),
                 norm_before_residual=config.bool("norm_before_residual", optional=True),
                 **_norm_output(config, fmt))
    tensors, maps = _tensors(path)
    if "fc.weight" not in tensors:
        raise DraftError(f"{path}: no fc.weight in its safetensors (an EAGLE-3 draft projects its aux states with "
                         f"fc; found {', '.join(sorted(tensors)[:8])}{' ...' if len(tensors) > 8 else ''})")
    return Draft(path=path, format=fmt, architecture=archs[0], hidden_size=hidden_size, tensors=tensors,
                 vocab_maps=maps, **typed)
