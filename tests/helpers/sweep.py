"""Sweeps that every run samples: a parametrised test over many cases of one mechanism (every write step, every
misspelled option) runs a representative few by default and every case with `pytest --every-case`.

Each case of a sweep costs whole runs of an entry point (seconds each on 2 cores); the cases the default run keeps
cover each kind of case the mechanism distinguishes, so a regression in the mechanism shows in the default run and
the full sweep is for changes to the mechanism itself. The default run counts the cases it left out as deselected.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import pytest

__all__ = ["EVERY_CASE", "sampled"]

EVERY_CASE = "every_case"


def sampled(cases: Iterable, keep: Sequence) -> list:
    """`cases` for parametrize, those not in `keep` marked to run only under --every-case."""
    cases = list(cases)
    unknown = [k for k in keep if k not in cases]
    if unknown:
        raise ValueError(f"kept cases {unknown} are not cases of this sweep")
    return [c if c in keep else pytest.param(c, marks=getattr(pytest.mark, EVERY_CASE)) for c in cases]
