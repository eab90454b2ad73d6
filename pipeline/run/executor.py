"""The executor contract: run a stage's units (pipeline.run.contract) on engine replicas and hand back one result per
unit; nothing here knows what a stage writes.

What every executor does is here: which units are still to run (finished ones are checked and skipped), progress,
failures, and results in unit order. A subclass decides only where the replicas live and how units reach them
(`LocalExecutor`: one engine in this process or its worker; `RayExecutor`: one actor per replica). A started
executor also looks like an engine to the diff gate: `capture` runs a batch on a replica without writing, `info` says
what the replicas run.
"""
from __future__ import annotations

import abc
import logging
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

from pipeline.core.cli import RunFailed
from pipeline.core.contracts import Capture, EngineInfo, EngineSpec, PreparedSample
from pipeline.engines.base import Engine, Task
from pipeline.engines.registry import make_engine
from pipeline.points import Point
from pipeline.run.contract import StagePlan, UnitResult, unfinished_units
from pipeline.run.progress import RunProgress

T = TypeVar("T")
OnDone = Callable[[UnitResult], None]
log = logging.getLogger(__name__)


class UnitsFailed(RunFailed, RuntimeError):
    """Some units could not be captured (after all retries); the run has no manifest."""


class Executor(abc.ABC):
    def __init__(self, spec: EngineSpec, *, model_path: str, points: Sequence[Point], num_layers: int,
                 trust_remote_code: bool = False, task: Task = "capture") -> None:
        self.spec, self.task = spec, task
        self.model_path, self.points, self.num_layers = model_path, list(points), num_layers
        self.trust_remote_code = trust_remote_code
        self.max_seq_len: int | None = None  # set by `expect` once the data is prepared
        self.make_engine()  # constructing loads nothing; an engine whose adapter or environment is absent fails here

    def expect(self, samples: Sequence[PreparedSample] = (), *, longest: int | None = None) -> None:
        """Tell the engines (before they start) the longest sequence they will be sent: the run's samples, or
        `longest` tokens (a regeneration: prompt and answer together)."""
        self.max_seq_len = longest if longest is not None else max((s.num_tokens for s in samples), default=None)

    def make_engine(self) -> Engine:
        """One replica's engine, not started (also what a Ray actor calls, in its own process)."""
        return make_engine(self.spec, model_path=self.model_path, points=self.points, num_layers=self.num_layers,
                           trust_remote_code=self.trust_remote_code, max_seq_len=self.max_seq_len, task=self.task)

    @abc.abstractmethod
    def __enter__(self) -> "Executor":
        """Start every replica; EngineStartError when the engine does not start."""

    @abc.abstractmethod
    def __exit__(self, *exc: object) -> None:
        """Close every replica."""

    def run_beside(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run `fn` where a replica runs (the gate's other engines need what a replica has); here: in place."""
        return fn(*args, **kwargs)

    @abc.abstractmethod
    def info(self) -> EngineInfo:
        """What the replicas run (the same everywhere)."""

    @abc.abstractmethod
    def capture(self, samples: Sequence[PreparedSample]) -> list[Capture]:
        """Capture one batch on a replica without writing anything (the diff gate's probe)."""

    @abc.abstractmethod
    def _run_units(self, settings: StagePlan, run_dir: Path, units: Sequence[Sequence[Any]],
                   todo: list[int], done: OnDone) -> dict[int, str]:
        """Run the units `todo`, calling `done` with each result; return the error of each unit that failed."""

    def run(self, settings: StagePlan, run_dir: Path, units: Sequence[Sequence[Any]],
            progress: RunProgress | None = None) -> list[Any]:
        """Every unit's result in unit order; units finished by an earlier invocation are checked and skipped."""
        results: dict[int, Any] = {}
        with progress or RunProgress(units) as progress:
            def done(result: UnitResult) -> None:
                results[result.index] = result
                progress.unit_done(result)

            todo = unfinished_units(run_dir, len(units), done, settings)
            if results and todo and (warning := settings.resume_warning(run_dir, list(results.values()))):
                log.warning("%s", warning)
            failures = self._run_units(settings, run_dir, units, todo, done)
        if failures:
            raise UnitsFailed("; ".join(f"unit {i} ({units[i][0].sample_id}...): {err}"
                                        for i, err in sorted(failures.items())))
        return [results[i] for i in range(len(units))]
