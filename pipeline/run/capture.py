"""The capture stage: one work unit (the samples of one shard) -> engine batches -> validation -> one shard.

A stage knows nothing of how it is run; executors (local, Ray) hand it units and skip finished ones. A unit has two
halves: `compute` (the engine's) and `write` (validation, safetensors + parquet, checksums: the driver's CPU). An
engine computing on GPUs leaves the host idle, so `run_units` can write unit k while the engine captures unit k+1.
The regeneration stage (pipeline/regen/stage.py) has the same two halves and runs through the same executors: the
`Stage` and `StagePlan` shapes below are what an executor needs of either.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

from pipeline.core.contracts import Capture, PreparedSample, Reject
from pipeline.data.prepare import read_rejects, write_rejects
from pipeline.engines.base import Engine
from pipeline.points import Point
from pipeline.core.lifecycle import check_lease
from pipeline.shards.directory import RUN_DIR
from pipeline.shards.layout import rejects_path
from pipeline.shards.validate import capture_reject
from pipeline.shards.writer import ShardEntry, completed_shard, write_shard



class Stage(Protocol):
    """A stage bound to one engine: `compute` is the engine's half of a unit, `write` the driver's."""

    def compute(self, items: Sequence[Any]) -> Any: ...

    def write(self, run_dir: Path, index: int, items: Sequence[Any], computed: Any) -> Any: ...


class StagePlan(Protocol):
    """What an executor runs (small and picklable: it travels to Ray actors): the stage for a replica's engine, and
    the result of a unit an earlier invocation finished (None: still to run)."""

    overlap_writes: bool

    def stage(self, engine: Engine) -> Stage: ...

    def finished(self, run_dir: Path, index: int) -> Any: ...


@dataclass(kw_only=True)
class UnitResult:
    index: int
    entry: ShardEntry | None  # None when every sample of the unit was rejected
    rejects: list[Reject] = field(default_factory=list)
    skipped: bool = False  # finished by an earlier invocation


def _batches(samples: Sequence[PreparedSample], batch_size: int) -> list[list[PreparedSample]]:
    # Similar lengths batch together to cut padding; results are put back in unit order before writing. Batches are
    # balanced (75 samples at batch_size 64: 38 + 37, not 64 + 11): a small tail batch leaves an engine underfilled.
    ordered = sorted(samples, key=lambda s: s.num_tokens)
    num_batches = -(-len(ordered) // batch_size)
    bounds = [i * len(ordered) // num_batches for i in range(num_batches + 1)] if ordered else []
    return [ordered[a:b] for a, b in zip(bounds, bounds[1:])]


@dataclass(frozen=True, kw_only=True)
class StageSettings:
    """Everything a capture stage needs besides its engine (small and picklable: it travels to Ray actors)."""

    points: list[Point]
    hidden_size: int
    batch_size: int
    storage_dtype: str | None
    metadata: Mapping[str, str]  # the compact provenance stored in every shard
    overlap_writes: bool = False  # write unit k while unit k+1 is captured (runner.overlap_writes)
    lease_token: str | None = None  # the run directory's lease (pipeline.core.lifecycle): checked before a shard is finished

    def stage(self, engine: Engine) -> "CaptureStage":
        return CaptureStage(engine=engine, settings=self)

    def finished(self, run_dir: Path, index: int) -> UnitResult | None:
        return finished_unit(run_dir, index)


def finished_unit(run_dir: Path, index: int) -> UnitResult | None:
    """The result of a unit finished by an earlier invocation: its marker, sizes and sha256 all check out."""
    entry = completed_shard(run_dir, index, sha256=True)
    if entry is None:
        return None
    return UnitResult(index=index, entry=entry, rejects=read_rejects(rejects_path(run_dir, index)), skipped=True)


def unfinished_units(run_dir: Path, num_units: int, on_finished: Callable[[Any], None],
                     plan: StagePlan | None = None) -> list[int]:
    """Indices of the units still to run; each unit finished by an earlier invocation (as `plan` judges it: the
    capture stage's shards by default) goes to `on_finished`."""
    todo = []
    for index in range(num_units):
        finished = plan.finished(run_dir, index) if plan is not None else finished_unit(run_dir, index)
        if finished is None:
            todo.append(index)
        else:
            on_finished(finished)
    return todo


@dataclass(kw_only=True)
class CaptureStage:
    engine: Engine
    settings: StageSettings

    def capture(self, samples: Sequence[PreparedSample]) -> dict[str, Capture]:
        """The engine's half of a unit: sample id -> capture (a sample the engine dropped is simply absent)."""
        captures = {}
        for batch in _batches(samples, self.settings.batch_size):
            for sample, capture in zip(batch, self.engine.capture(batch)):
                captures[sample.sample_id] = capture
        return captures

    compute = capture

    def write(self, run_dir: Path, index: int, samples: Sequence[PreparedSample],
              captures: Mapping[str, Capture]) -> UnitResult:
        """The driver's half: validate every capture against its prepared sample, write the shard and its rejects."""
        cfg = self.settings
        items, rejects = [], []
        for sample in samples:
            capture = captures.get(sample.sample_id)
            reject = None if capture is not None else Reject(
                source=sample.source, row=sample.row, sample_id=sample.sample_id, reason="not_captured",
                detail="the engine returned no result for this sample")
            reject = reject or capture_reject(sample, capture, num_points=len(cfg.points),
                                              hidden_size=cfg.hidden_size)
            if reject is not None:
                rejects.append(reject)
            else:
                items.append((sample, capture))
        check_lease(run_dir, cfg.lease_token, RUN_DIR)
        # Capture rejects are written before the shard's completion marker, so a resumed run still reports them.
        if rejects:
            write_rejects(rejects_path(run_dir, index), rejects)
        else:  # a redone unit that rejects nothing now: an earlier attempt's rejects are not this shard's
            rejects_path(run_dir, index).unlink(missing_ok=True)
        entry = None
        if items:
            entry = write_shard(run_dir, index, items, points=[p.label for p in cfg.points],
                                storage_dtype=cfg.storage_dtype, metadata=cfg.metadata,
                                before_marker=partial(check_lease, run_dir, cfg.lease_token, RUN_DIR))
        return UnitResult(index=index, entry=entry, rejects=rejects)

    def run_unit(self, run_dir: Path, index: int, samples: Sequence[PreparedSample]) -> UnitResult:
        return self.write(run_dir, index, samples, self.capture(samples))


def run_units(stage: Stage, run_dir: Path, units: Iterable[tuple[int, Sequence[Any]]],
              on_done: Callable[[Any], None], *, overlap: bool) -> None:
    """Run units in order; with `overlap`, unit k is written on a thread while the engine captures unit k+1.

    Overlapped, at most two units' captures are in memory (the one being written, the one just captured). A failed
    write surfaces at the next unit boundary; a failed capture waits for the write in flight, so no shard is left
    half written by this process.
    """
    if not overlap:
        for index, samples in units:
            on_done(stage.write(run_dir, index, samples, stage.compute(samples)))
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-writer") as writer:
        pending: Future[UnitResult] | None = None
        for index, samples in units:
            captures = stage.compute(samples)
            if pending is not None:
                on_done(pending.result())
            pending = writer.submit(stage.write, run_dir, index, samples, captures)
        if pending is not None:
            on_done(pending.result())
