"""The acceptance figures from raw cumulative counters (pipeline/acceptance/figures.py)."""
from __future__ import annotations

import pytest

from pipeline.acceptance.figures import delta, figures, total


def _c(drafts, tokens, accepted, per_pos):
    return {"drafts": drafts, "draft_tokens": tokens, "accepted": accepted, "accepted_per_pos": per_pos}


def test_a_prompt_is_the_difference_of_two_reads_and_the_figures_follow():
    one = delta(_c(4, 12, 3, [2, 1, 0]), _c(14, 42, 15, [9, 4, 2]))
    assert one == _c(10, 30, 12, [7, 3, 2])
    got = figures(one)
    assert got["acceptance_length"] == pytest.approx(2.2)
    assert got["per_position"] == pytest.approx([0.7, 0.3, 0.2])
    assert got["draft_token_rate"] == pytest.approx(0.4)


def test_overall_sums_counts_not_ratios_and_nothing_drafted_is_none():
    assert total([_c(1, 3, 3, [1, 1, 1]), _c(3, 9, 0, [0, 0, 0])]) == _c(4, 12, 3, [1, 1, 1])
    assert figures(_c(0, 0, 0, [0, 0, 0])) == {"acceptance_length": None, "per_position": None,
                                                "draft_token_rate": None}
