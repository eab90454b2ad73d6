"""Progress of a run as units finish, for any executor: a live bar on a terminal, a log line per unit everywhere."""
from __future__ import annotations

import logging
import time
from typing import Any, Sequence

from pipeline.core.bar import live_bar
from pipeline.run.contract import UnitResult

log = logging.getLogger("pipeline.run")


class RunProgress:
    """Samples done, tokens/s and ETA; units finished by an earlier invocation do not inflate the rate.

    The tokens counted are the units' own (`PreparedSample.num_tokens`: captured tokens), or, with `produced`, the
    tokens each unit's result says it produced (`UnitResult.produced_tokens`: regeneration's generated tokens, known
    only when the unit ends); the ETA then follows the samples left."""

    def __init__(self, units: Sequence[Sequence[Any]], label: str = "capture", *, produced: bool = False) -> None:
        self._label = label
        self._tokens = [0 if produced else sum(s.num_tokens for s in u) for u in units]
        self._samples = [len(u) for u in units]
        self._num_units = len(units)
        self._left = sum(self._tokens)
        self._captured = 0
        self._captured_samples = 0
        self._started = time.perf_counter()
        self._samples_left = sum(self._samples)
        self._bar = live_bar(label, "{task.fields[samples_s]:>6.1f} samples/s", "{task.fields[tok_s]:>8.0f} tok/s")
        self._task = self._bar.add_task(label, total=sum(len(u) for u in units), tok_s=0.0,
                                        samples_s=0.0)

    def __enter__(self) -> "RunProgress":
        self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.stop()

    def unit_done(self, result: UnitResult) -> None:
        produced = result.produced_tokens
        tokens, num_samples = self._tokens[result.index] if produced is None else produced, self._samples[result.index]
        self._left -= self._tokens[result.index]
        self._samples_left -= num_samples
        if not result.skipped:  # finished earlier: counts as done, not as throughput
            self._captured += tokens
            self._captured_samples += num_samples
        elapsed = max(time.perf_counter() - self._started, 1e-9)
        rate, sample_rate = self._captured / elapsed, self._captured_samples / elapsed
        if produced is None:
            eta = self._left / rate if rate else 0.0
        else:
            eta = self._samples_left / sample_rate if sample_rate else 0.0
        self._bar.update(self._task, advance=num_samples, tok_s=rate, samples_s=sample_rate)
        log.info("%s unit %d/%d %s: %d samples, %d tokens, %d rejected | %.1f samples/s, %.0f tok/s, ETA %.0fs",
                 self._label, result.index + 1, self._num_units,
                 "skipped (finished earlier)" if result.skipped else "written",
                 num_samples, tokens, len(result.rejects), sample_rate, rate, eta)
