"""Synthetic samples for the engine tests, and the relative L2 distance their captures are compared by."""
from __future__ import annotations

import numpy as np
import torch

from pipeline.core.contracts import PreparedSample

__all__ = ["rel_l2", "samples_of"]


def samples_of(lengths, vocab: int = 4000, seed: int = 0, first: int = 0) -> list[PreparedSample]:
    """One sample per length, token ids drawn from [10, vocab) with this seed, every token in the loss; sample i is
    `s{seed}-{first + i}` at row `first + i` (ids stay distinct across seeds and across consecutive units)."""
    rng = np.random.default_rng(seed)
    return [PreparedSample(sample_id=f"s{seed}-{first + i}", source="synthetic", row=first + i,
                           input_ids_T=rng.integers(10, vocab, size=n).astype(np.int64),
                           loss_mask_T=np.ones(n, dtype=np.uint8)) for i, n in enumerate(lengths)]


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64; against an all-zero reference, the absolute ||a - b||."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm()) if b.norm() > 0 else float((a - b).norm())
