"""How far two captures of the same point are apart: pure functions on float32 tensors.

Inputs are per-sample tensors `[T_i, H]` (the same samples, the same tokens, in the same order); every statistic is
computed in float32 whatever dtype the engines ran in. Per-token relative L2 is ||b_t - a_t|| / ||a_t|| with `a`
the reference side; the aggregate is the same ratio over all tokens at once (dominated by large-norm tokens, which is
why per-token quantiles are reported beside it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

_TINY = 1e-30


@dataclass(kw_only=True)
class PointStats:
    num_tokens: int
    rel_l2: float  # aggregate: ||B - A||_F / ||A||_F
    cosine: float  # mean per-token cosine similarity
    cosine_min: float
    max_abs: float
    p50: float  # quantiles of per-token relative L2
    p90: float
    p99: float
    max: float
    pos0: float  # mean per-token relative L2 at position 0
    later: float  # ... at positions >= 1
    flip_fraction: float  # fraction of tokens with relative L2 > token_level
    identical: bool  # bit for bit
    profile: list[float] = field(default_factory=list)  # mean per-token relative L2 by position

    @property
    def judged_rel_l2(self) -> float:
        """What `thresholds.rel_l2` bounds: the larger of the aggregate and the 90th percentile per token."""
        return max(self.rel_l2, self.p90)


def as_float(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([p.float() for p in parts]) if parts else torch.zeros(0)


def positions_of(lengths: Sequence[int]) -> torch.Tensor:
    return torch.cat([torch.arange(n) for n in lengths]) if lengths else torch.zeros(0, dtype=torch.long)


def per_token_rel_l2(a_TH: torch.Tensor, b_TH: torch.Tensor) -> torch.Tensor:
    return (b_TH - a_TH).norm(dim=-1) / a_TH.norm(dim=-1).clamp_min(_TINY)


def per_token_cosine(a_TH: torch.Tensor, b_TH: torch.Tensor) -> torch.Tensor:
    denom = (a_TH.norm(dim=-1) * b_TH.norm(dim=-1)).clamp_min(_TINY)
    cos = (a_TH * b_TH).sum(dim=-1) / denom
    both_zero = (a_TH.abs().amax(dim=-1) == 0) & (b_TH.abs().amax(dim=-1) == 0)
    return torch.where(both_zero, torch.ones_like(cos), cos)


def position_profile(values_T: torch.Tensor, positions_T: torch.Tensor) -> torch.Tensor:
    """Mean of a per-token value at each position (over the samples long enough to have it)."""
    length = int(positions_T.max()) + 1 if positions_T.numel() else 0
    total = torch.zeros(length).index_add_(0, positions_T, values_T)
    count = torch.zeros(length).index_add_(0, positions_T, torch.ones_like(values_T))
    return total / count.clamp_min(1)


def _quantiles(values: torch.Tensor, qs: Sequence[float]) -> list[float]:
    if values.numel() == 0:
        return [0.0] * len(qs)
    return [float(v) for v in torch.quantile(values.double(), torch.tensor(qs, dtype=torch.float64))]


def point_stats(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor], *, token_level: float) -> PointStats:
    """Statistics of B against A at one point; a and b hold one [T_i, H] tensor per sample."""
    lengths = [int(x.shape[0]) for x in a]
    if [int(x.shape[0]) for x in b] != lengths:
        raise ValueError(f"token counts differ: {lengths} vs {[int(x.shape[0]) for x in b]}")
    identical = all(torch.equal(x, y) for x, y in zip(a, b))
    A, B = as_float(a), as_float(b)
    pos = positions_of(lengths)
    rel = per_token_rel_l2(A, B)
    cos = per_token_cosine(A, B)
    p50, p90, p99, pmax = _quantiles(rel, (0.5, 0.9, 0.99, 1.0))
    at0, later = rel[pos == 0], rel[pos > 0]
    return PointStats(
        num_tokens=int(A.shape[0]),
        rel_l2=float((B - A).norm() / A.norm().clamp_min(_TINY)),
        cosine=float(cos.mean()) if cos.numel() else 1.0,
        cosine_min=float(cos.min()) if cos.numel() else 1.0,
        max_abs=float((B - A).abs().max()) if A.numel() else 0.0,
        p50=p50, p90=p90, p99=p99, max=pmax,
        pos0=float(at0.mean()) if at0.numel() else 0.0,
        later=float(later.mean()) if later.numel() else 0.0,
        flip_fraction=float((rel > token_level).float().mean()) if rel.numel() else 0.0,
        identical=identical,
        profile=[float(v) for v in position_profile(rel, pos)],
    )
