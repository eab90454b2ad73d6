"""What the comparison reads from the checkpoint itself, independent of every engine.

The embedding table (b0 must be an exact row lookup), the final RMSNorm and the LM head (logits of any engine's final
state, in float32), and which decoder layers are MoE layers (where routing flips can start). These tensors are
unquantized even in INT4 checkpoints (compressed-tensors leaves embeddings, norms and lm_head dense).
Only the tensors needed are read, by name, through safetensors; the model is never loaded.
"""
from __future__ import annotations

import re
from functools import cached_property
from pathlib import Path
from typing import Any, Sequence

import torch
from safetensors import safe_open

from pipeline.core.jsonfile import read_fields, read_object
from pipeline.models.info import text_config

_FINAL_NORM = re.compile(r"(^|\.)norm\.weight$")
_SKIP = ("vision", "mm_projector", "multi_modal", "audio")


class CheckpointError(ValueError):
    """A tensor the comparison needs is not in the checkpoint."""


def moe_layers(config: dict[str, Any]) -> set[int]:
    """1-based numbers of the decoder layers whose MLP is a routed mixture of experts (layer k sits between b(k-1)
    and b(k)); empty for dense models."""
    text = text_config(config)
    n = int(text.get("num_hidden_layers", 0))
    if text.get("n_routed_experts"):  # DeepSeek-V2/V3, Kimi-K2
        first_dense = int(text.get("first_k_dense_replace", 0))
        freq = int(text.get("moe_layer_freq", 1) or 1)
        return {i + 1 for i in range(n) if i >= first_dense and i % freq == 0}
    if text.get("num_local_experts") or text.get("num_experts"):  # Mixtral, Qwen-MoE
        dense = set(text.get("mlp_only_layers") or [])
        step = int(text.get("decoder_sparse_step", 1) or 1)
        return {i + 1 for i in range(n) if i not in dense and (i + 1) % step == 0}
    return set()


class Checkpoint:
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

    def embedding_rows(self, ids: Sequence[int]) -> torch.Tensor:
        """Rows of the embedding table for token ids, in the checkpoint's dtype ([len(ids), H])."""
        with safe_open(str(self._files[self.embedding_name]), "pt") as st:
            table = st.get_slice(self.embedding_name)
            unique = sorted(set(int(i) for i in ids))
            rows = {i: table[i: i + 1] for i in unique}
        return torch.cat([rows[int(i)] for i in ids]) if len(ids) else torch.zeros(0)

    def final_norm(self, x_TH: torch.Tensor) -> torch.Tensor:
        """The model's final RMSNorm in float32: w * x / sqrt(mean(x^2) + eps)."""
        x = x_TH.float()
        return self.norm_weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    def compare_logits(self, a_TH: torch.Tensor, b_TH: torch.Tensor,
                       vocab_chunk: int = 8192) -> tuple[torch.Tensor, torch.Tensor]:
        """Per token: whether the top-1 tokens agree, and KL(softmax(a W^T) || softmax(b W^T)) in nats, for two sets of
        already-normed states, in float32. Streams over the vocabulary twice (log-sum-exp and argmax, then KL), so
        memory stays at [T, vocab_chunk] whatever the vocabulary (Kimi: 163840 x 7168)."""
        a, b = a_TH.float(), b_TH.float()
        w = self.head_weight
        t = a.shape[0]
        lse = [torch.full((t,), -torch.inf), torch.full((t,), -torch.inf)]
        best = [torch.full((t,), -torch.inf), torch.full((t,), -torch.inf)]
        arg = [torch.zeros(t, dtype=torch.long), torch.zeros(t, dtype=torch.long)]
        for i in range(0, w.shape[0], vocab_chunk):
            chunk = w[i: i + vocab_chunk].float()
            for k, x in enumerate((a, b)):
                z = x @ chunk.T
                lse[k] = torch.logaddexp(lse[k], torch.logsumexp(z, dim=-1))
                top, where = z.max(dim=-1)
                better = top > best[k]  # strictly: the first maximum wins, as in argmax over the whole row
                best[k], arg[k] = torch.where(better, top, best[k]), torch.where(better, where + i, arg[k])
        kl = torch.zeros(t)
        for i in range(0, w.shape[0], vocab_chunk):
            chunk = w[i: i + vocab_chunk].float()
            la, lb = a @ chunk.T - lse[0][:, None], b @ chunk.T - lse[1][:, None]
            kl += (la.exp() * (la - lb)).sum(dim=-1)
        return arg[0] == arg[1], kl.clamp_min(0)

    @cached_property
    def moe_layers(self) -> set[int]:
        return moe_layers(self.config)
