"""A resume judges the earlier invocation's units several at a time (a store's round trips, a disk's sha256 reads)
and still hands them on in unit order, with the units left to run in order; a unit whose check fails stops the resume
with that error."""
from __future__ import annotations

import random
import threading
import time

import pytest

from pipeline.run import contract


class Judge:
    """Units 3, 7 and 8 unfinished; each check takes a random short while and counts the checks in flight."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.lock, self.now, self.most, self.fail_at = threading.Lock(), 0, 0, fail_at

    def finished(self, run_dir, index):
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            time.sleep(random.uniform(0, 0.02))
            if index == self.fail_at:
                raise OSError(f"unit {index}: the marker could not be read")
            return None if index in (3, 7, 8) else f"unit {index}"
        finally:
            with self.lock:
                self.now -= 1


def test_units_are_judged_together_and_handed_on_in_order(tmp_path):
    judge, seen = Judge(), []
    todo = contract.unfinished_units(tmp_path, 40, seen.append, judge)
    assert todo == [3, 7, 8]
    assert seen == [f"unit {i}" for i in range(40) if i not in (3, 7, 8)]
    assert 1 < judge.most <= contract.RESUME_THREADS


def test_a_check_that_fails_stops_the_resume_with_its_error(tmp_path):
    with pytest.raises(OSError, match="unit 11: the marker could not be read"):
        contract.unfinished_units(tmp_path, 40, lambda _: None, Judge(fail_at=11))
