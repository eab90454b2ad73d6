"""Partition prepared samples into work units; one unit becomes one shard.

The unit size is what bounds memory: a worker captures and writes one unit at a time, so peak memory follows
`max_tokens_per_shard`, not the dataset. The partition depends only on the input order and the two limits, so a
rerun (or another executor) derives the same units and the same shard indices, which is what makes resume work.
"""
from __future__ import annotations

from typing import Sequence

from pipeline.core.contracts import PreparedSample


def plan_units(samples: Sequence[PreparedSample], *, max_tokens_per_shard: int,
               max_samples_per_shard: int) -> list[list[PreparedSample]]:
    """Greedy partition in input order; a sample longer than `max_tokens_per_shard` gets a unit of its own."""
    if max_tokens_per_shard < 1:
        raise ValueError(f"max_tokens_per_shard={max_tokens_per_shard} must be >= 1")
    if max_samples_per_shard < 1:
        raise ValueError(f"max_samples_per_shard={max_samples_per_shard} must be >= 1")
    units: list[list[PreparedSample]] = []
    current: list[PreparedSample] = []
    current_tokens = 0
    for sample in samples:
        fits = (current_tokens + sample.num_tokens <= max_tokens_per_shard
                and len(current) < max_samples_per_shard)
        if current and not fits:
            units.append(current)
            current, current_tokens = [], 0
        current.append(sample)
        current_tokens += sample.num_tokens
    if current:
        units.append(current)
    return units
