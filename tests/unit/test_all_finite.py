"""`all_finite` (a capture on its way to the disk, a reference export's sample on its way to a trainer) answers as
`torch.isfinite(t).all()` does, for every float dtype a run stores or captures, whatever the layout: a NaN, +inf or
-inf anywhere (the first block, the last, a strided view's visible part) is found, and values the view skips are not
read."""
from __future__ import annotations

import pytest
import torch

from pipeline.shards.validate import FINITE_BLOCK_BYTES, all_finite

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.float8_e4m3fn]
BAD = [float("nan"), float("inf"), float("-inf"), -float("nan")]


def _states(dtype: torch.dtype, tokens: int, points: int = 5, width: int = 96) -> torch.Tensor:
    return (torch.randn(tokens, points, width) * 100).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_finite_states_pass_and_each_non_finite_value_is_found_where_it_is(dtype):
    tokens = 3 * FINITE_BLOCK_BYTES // (5 * 96 * torch.finfo(dtype).bits // 8) + 7  # more than three blocks
    states = _states(dtype, tokens)
    assert all_finite(states) and bool(torch.isfinite(states.float()).all())
    for value in BAD if dtype != torch.float8_e4m3fn else BAD[::3]:  # e4m3fn has NaN, and no infinity
        for token in (0, tokens // 2, tokens - 1):
            bad = states.clone()
            bad[token, 3, 17] = value
            assert not all_finite(bad), (value, token)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_a_strided_view_is_checked_on_what_it_shows(dtype):
    states = _states(dtype, 40)
    states[5, 0, 3] = float("nan")  # a point the view skips: not the view's
    view = states[:, 1:5]
    assert not view.is_contiguous() and all_finite(view)
    states[39, 4, 95] = float("-inf")
    assert not all_finite(view)
    assert not all_finite(states[:, ::2, :])  # a last dim with stride 1 but points skipped by step: still found
    assert all_finite(states[:, 1:4, ::2])  # a last dim that is not contiguous (aminmax): -inf is at point 4


def test_edge_shapes():
    assert all_finite(torch.empty(0, 4, 8, dtype=torch.bfloat16))
    assert all_finite(torch.tensor(1.5, dtype=torch.bfloat16))
    assert not all_finite(torch.tensor(float("inf"), dtype=torch.bfloat16))
    assert not all_finite(torch.tensor([1.0, float("nan")], dtype=torch.float16))
    big = torch.full((8,), 3.0e38, dtype=torch.float32)  # the largest finite values are finite
    assert all_finite(big) and all_finite(big.to(torch.bfloat16).nan_to_num(posinf=3.0e38))
