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
from pipeline.core.io import read_json_object

FORMATS = ("specforge", "speculators", "mla")
_VOCAB_MAPS = ("d2t", "t2d")


class DraftError(UsageError, ValueError):
    """A draft directory that cannot be read: named file missing, not JSON, or no EAGLE-3 draft at all."""


@dataclass(frozen=True)
class Tensor:
    shape: tuple[int, ...]
    dtype: str


@dataclass(kw_only=True)
class Draft:
    path: Path
    format: str
    architecture: str
    config: dict[str, Any]  # config.json as written
    layer_config: dict[str, Any]  # the decoder layer's config (speculators nests it)
    hidden_size: int
    vocab_size: int | None  # the target vocabulary the draft maps into
    draft_vocab_size: int | None
    target_hidden_size: int | None  # None: the draft's hidden size
    eagle_config: dict[str, Any] | None
    top_level_aux_ids: list[int] | None  # `eagle_aux_hidden_state_layer_ids` at the top level (speculators, vLLM)
    tensors: dict[str, Tensor]
    vocab_maps: dict[str, torch.Tensor] = field(default_factory=dict)  # d2t / t2d, loaded (small)

    @property
    def eagle_config_aux_ids(self) -> list[int] | None:
        ids = (self.eagle_config or {}).get("eagle_aux_hidden_state_layer_ids")
        return list(ids) if ids else None

    @property
    def fc_in(self) -> int | None:
        fc = self.tensors.get("fc.weight")
        return fc.shape[1] if fc is not None and len(fc.shape) == 2 else None

    @property
    def input_width(self) -> int:
        return self.target_hidden_size or self.hidden_size


def _read_json(path: Path) -> dict[str, Any]:
    return read_json_object(path, DraftError,
                            missing_hint=" (a draft directory holds config.json and *.safetensors)")


def schema_of(config: dict[str, Any]) -> str:
    archs = config.get("architectures") or []
    if config.get("speculators_model_type") or config.get("speculators_config"):
        if config.get("speculators_model_type", "eagle3") != "eagle3":
            raise DraftError(f"speculators_model_type {config['speculators_model_type']!r} is not an EAGLE-3 draft "
                             "(the doctor reads eagle3)")
        return "speculators"
    if any("Deepseek" in a and "Eagle3" in a for a in archs) or "kv_lora_rank" in config:
        return "mla"
    if any("Eagle3" in a for a in archs) or "eagle_config" in config or "draft_vocab_size" in config:
        return "specforge"
    raise DraftError(f"config.json architectures {archs} is no EAGLE-3 draft the doctor knows: "
                     "LlamaForCausalLMEagle3 (SpecForge/SGLang), Eagle3Speculator (speculators), "
                     "Eagle3DeepseekV2ForCausalLM (MLA)")


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
                    tensors[name] = Tensor(tuple(piece.get_shape()), str(piece.get_dtype()))
                    if name.rsplit(".", 1)[-1] in _VOCAB_MAPS:
                        maps[name.rsplit(".", 1)[-1]] = f.get_tensor(name)
        except Exception as exc:  # safetensors raises its own error types for a damaged header
            raise DraftError(f"{file} is not a readable safetensors file: {exc}") from None
    return tensors, maps


def read_draft(path: Path) -> Draft:
    path = Path(path)
    if not path.is_dir():
        raise DraftError(f"draft directory {path} does not exist")
    config = _read_json(path / "config.json")
    fmt = schema_of(config)
    layer = config.get("transformer_layer_config") or {} if fmt == "speculators" else config
    if not isinstance(layer, dict) or "hidden_size" not in layer:
        raise DraftError(f"{path / 'config.json'}: no hidden_size"
                         + (" in transformer_layer_config" if fmt == "speculators" else ""))
    tensors, maps = _tensors(path)
    if "fc.weight" not in tensors:
        raise DraftError(f"{path}: no fc.weight in its safetensors (an EAGLE-3 draft projects its aux states with "
                         f"fc; found {', '.join(sorted(tensors)[:8])}{' ...' if len(tensors) > 8 else ''})")
    archs = config.get("architectures") or ["?"]
    eagle_config = config.get("eagle_config")
    top_ids = config.get("eagle_aux_hidden_state_layer_ids")
    return Draft(path=path, format=fmt, architecture=archs[0], config=config, layer_config=layer,
                 hidden_size=int(layer["hidden_size"]), vocab_size=layer.get("vocab_size"),
                 draft_vocab_size=config.get("draft_vocab_size"),
                 target_hidden_size=config.get("target_hidden_size"),
                 eagle_config=eagle_config if isinstance(eagle_config, dict) else None,
                 top_level_aux_ids=list(top_ids) if top_ids else None, tensors=tensors, vocab_maps=maps)
