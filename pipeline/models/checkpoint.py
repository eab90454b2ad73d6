"""A safetensors checkpoint directory's named tensors, read by name without loading the model: the final RMSNorm, the
embedding table and the LM head, found under whichever prefix the architecture uses (vision and projector towers
skipped). Unquantized even in INT4 checkpoints (compressed-tensors leaves embeddings, norms and lm_head dense).
"""
from __future__ import annotations

import re
from functools import cached_property
from pathlib import Path

import torch
from safetensors import safe_open

from pipeline.core.jsonfile import read_fields, read_object
from pipeline.models.info import text_config

_FINAL_NORM = re.compile(r"(^|\.)norm\.weight$")
_SKIP = ("vision", "mm_projector", "multi_modal", "audio")


class CheckpointError(ValueError):
    """A tensor that is needed is not in the checkpoint."""


class CheckpointTensors:
    """Named tensors of a safetensors checkpoint directory, read lazily."""

    def __init__(self, model_dir: str | Path) -> None:
        self.path = Path(model_dir)
        self.config = read_object(self.path / "config.json", ValueError)
        self.text = text_config(self.config)

    @cached_property
    def _files(self) -> dict[str, Path]:
        """tensor name -> file."""
        index = self.path / "model.safetensors.index.json"
        if index.is_file():
            weight_map = read_fields(index, ValueError).obj("weight_map").value
            return {k: self.path / v for k, v in weight_map.items()}
        names: dict[str, Path] = {}
        for f in sorted(self.path.glob("*.safetensors")):
            with safe_open(str(f), "pt") as st:
                names.update({k: f for k in st.keys()})
        return names

    def _find(self, what: str, match) -> str:
        found = sorted((k for k in self._files if match(k) and not any(s in k for s in _SKIP)), key=len)
        if not found:
            raise CheckpointError(f"{self.path}: no {what} tensor in the checkpoint")
        return found[0]

    def _tensor(self, name: str) -> torch.Tensor:
        with safe_open(str(self._files[name]), "pt") as st:
            return st.get_tensor(name)

    @cached_property
    def embedding_name(self) -> str:
        return self._find("embedding (…embed_tokens.weight)", lambda k: k.endswith("embed_tokens.weight"))

    @cached_property
    def head_name(self) -> str:
        try:
            return self._find("LM head (…lm_head.weight)", lambda k: k.endswith("lm_head.weight"))
        except CheckpointError:
            if self.text.get("tie_word_embeddings") or self.config.get("tie_word_embeddings"):
                return self.embedding_name
            raise

    @cached_property
    def norm_name(self) -> str:
        return self._find("final norm (…model.norm.weight)", lambda k: _FINAL_NORM.search(k) and "layers." not in k)

    @cached_property
    def norm_weight(self) -> torch.Tensor:
        return self._tensor(self.norm_name).float()

    @property
    def eps(self) -> float:
        return float(self.text.get("rms_norm_eps", 1e-6))

    @cached_property
    def head_weight(self) -> torch.Tensor:
        """[V, H], kept in the checkpoint's dtype; cast to float32 chunk by chunk (Kimi's head is 2.3 GB in bf16)."""
        return self._tensor(self.head_name)

    def final_norm(self, x_TH: torch.Tensor, mean_square_T1: torch.Tensor | None = None) -> torch.Tensor:
        """The model's final RMSNorm in float32: w * x / sqrt(mean(x^2) + eps); `mean_square_T1`: mean(x^2) over the
        last dim, when the caller has it."""
        x = x_TH.float()
        if mean_square_T1 is None:
            mean_square_T1 = x.pow(2).mean(-1, keepdim=True)
        return self.norm_weight * (x * torch.rsqrt(mean_square_T1 + self.eps))
