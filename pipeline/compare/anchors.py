"""What the comparison reads from the checkpoint itself, independent of every engine.

The embedding table (b0 must be an exact row lookup), the final RMSNorm and the LM head (logits of any engine's final
state, in float32), and which decoder layers are MoE layers (where routing flips can start). These tensors are
unquantized even in INT4 checkpoints (compressed-tensors leaves embeddings, norms and lm_head dense).
Only the tensors needed are read, by name, through safetensors; the model is never loaded.
"""
from __future__ import annotations

from functools import cached_property
from typing import Any, Sequence

import torch
from safetensors import safe_open

from pipeline.models.checkpoint import CheckpointTensors
from pipeline.models.info import text_config


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


class Checkpoint(CheckpointTensors):
    """The checkpoint's tensors and what the comparison computes with them."""

    def embedding_rows(self, ids: Sequence[int]) -> torch.Tensor:
        """Rows of the embedding table for token ids, in the checkpoint's dtype ([len(ids), H])."""
        with safe_open(str(self._files[self.embedding_name]), "pt") as st:
            table = st.get_slice(self.embedding_name)
            unique = sorted(set(int(i) for i in ids))
            rows = {i: table[i: i + 1] for i in unique}
        return torch.cat([rows[int(i)] for i in ids]) if len(ids) else torch.zeros(0)

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
