"""The stage contract every executor runs (local, Ray), whatever the stage (capture, regeneration): a unit of work
has two halves, `compute` (the engine's) and `write` (the driver's CPU: validation, files, checksums), and a result.

Executors know only this module: which units an earlier invocation finished (the stage judges its own files), the
units still to run, in order, and with `overlap` unit k written on a thread while the engine computes unit k+1 (an
engine computing on GPUs leaves the host idle).
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol, Sequence

from pipeline.core.contracts import Reject
from pipeline.core.storage import REQUESTS_AT_ONCE, in_order
from pipeline.engines.base import Engine


@dataclass(kw_only=True)
class UnitResult:
    """What a unit left: its index, what it rejected, whether an earlier invocation had finished it."""

    index: int
    rejects: list[Reject] = field(default_factory=list)
    skipped: bool = False  # finished by an earlier invocation

    @property
    def produced_tokens(self) -> int | None:
        """Tokens the unit produced, where that is not its input (regeneration's generated tokens); None: its input
        tokens are the measure (capture)."""
        return None


class Stage(Protocol):
    """A stage bound to one engine: `compute` is the engine's half of a unit, `write` the driver's, and `publish`
    puts what `write` wrote where the job's directory is (a run on object storage: the unit's files uploaded from
    the spool; on disk: nothing to do). A unit is done once published."""

    def compute(self, items: Sequence[Any]) -> Any: ...

    def write(self, run_dir: Path, index: int, items: Sequence[Any], computed: Any) -> UnitResult: ...

    def publish(self, run_dir: Path, result: UnitResult) -> UnitResult: ...


class StagePlan(Protocol):
    """What an executor runs (small and picklable: it travels to Ray actors): the stage for a replica's engine, the
    result of a unit an earlier invocation finished (None: still to run), and what a resume is about to mix (one
    line, or None) given the units already finished."""

    overlap_writes: bool

    def stage(self, engine: Engine) -> Stage: ...

    def finished(self, run_dir: Path, index: int) -> UnitResult | None: ...

    def resume_warning(self, run_dir: Path, finished: Sequence[UnitResult]) -> str | None: ...


# Units judged at once on a resume: on a store each is a few round trips (its marker, its files' sizes, its rejects),
# on disk a full read (its sha256). One at a time, a run of 10,000 units in a bucket spent minutes before its first
# new unit (bench/README.md, resume; the bench sets this to compare).
RESUME_THREADS = REQUESTS_AT_ONCE


def unfinished_units(run_dir: Path, num_units: int, on_finished: Callable[[Any], None],
                     plan: StagePlan) -> list[int]:
    """Indices of the units still to run; each unit finished by an earlier invocation (as `plan` judges it) goes to
    `on_finished`, in order."""
    todo = []
    judged = in_order(lambda i: plan.finished(run_dir, i), range(num_units), threads=RESUME_THREADS, name="resume")
    for index, finished in enumerate(judged):
        if finished is None:
            todo.append(index)
        else:
            on_finished(finished)
    return todo


def run_units(stage: Stage, run_dir: Path, units: Iterable[tuple[int, Sequence[Any]]],
              on_done: Callable[[Any], None], *, overlap: bool) -> None:
    """Run units in order; with `overlap`, unit k is written and published on a thread while the engine computes unit
    k+1.

    Overlapped, at most two units' results are in memory (the one being written, the one just computed). A failed
    write surfaces at the next unit boundary; a failed compute waits for the write in flight, so no unit is left
    half written by this process. (Publishing unit k on a third thread while unit k+1 is written gained nothing on 2
    cores, where the writer, the upload and the server compete for them: bench/README.md, s3_write.)
    """
    def write(index: int, items: Sequence[Any], computed: Any) -> UnitResult:
        return stage.publish(run_dir, stage.write(run_dir, index, items, computed))

    if not overlap:
        for index, items in units:
            on_done(write(index, items, stage.compute(items)))
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="unit-writer") as writer:
        pending: Future[UnitResult] | None = None
        for index, items in units:
            computed = stage.compute(items)
            if pending is not None:
                on_done(pending.result())
            pending = writer.submit(write, index, items, computed)
        if pending is not None:
            on_done(pending.result())
