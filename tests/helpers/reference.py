"""An independent reference for captured points: a transformers causal LM run decoder layer by decoder layer."""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["layer_by_layer"]


def layer_by_layer(model, ids: np.ndarray) -> dict[str, torch.Tensor]:
    """Run the decoder layers one by one; the residual stream after each layer is the canonical boundary
    (`b0`..`bN`, [T, H]), and `final_norm` the final norm's output."""
    inner = model.get_decoder()
    x = torch.from_numpy(ids)[None]
    pos = torch.arange(x.shape[1])[None]
    with torch.inference_mode():
        h = inner.embed_tokens(x)
        states = {"b0": h[0]}
        rope = inner.rotary_emb(h, pos)
        for k, layer in enumerate(inner.layers, start=1):
            h = layer(h, position_embeddings=rope, attention_mask=None, position_ids=pos)  # sdpa: causal when None
            h = h[0] if isinstance(h, tuple) else h
            states[f"b{k}"] = h[0]
        states["final_norm"] = inner.norm(h)[0]
    return states
