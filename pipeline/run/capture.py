"""The capture stage: one work unit (the samples of one shard) -> engine batches -> validation -> one shard.

A stage knows nothing of how it is run (pipeline.run.contract); executors (local, Ray) hand it units and skip
finished ones. `compute` is the engine's capture, `write` validates every capture and writes the shard.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Mapping, Sequence

from pipeline.core.contracts import CPU_THREADS, Capture, PreparedSample, Reject
from pipeline.core.lifecycle import check_lease
from pipeline.core.stfile import read_header
from pipeline.data.prepare import read_rejects, write_rejects
from pipeline.engines.base import Engine
from pipeline.points import Point
from pipeline.run.contract import UnitResult
from pipeline.shards.directory import RUN_DIR
from pipeline.shards.layout import rejects_path
from pipeline.shards.validate import capture_reject
from pipeline.shards.writer import ShardEntry, completed_shard, write_shard


@dataclass(kw_only=True)
class ShardResult(UnitResult):
    entry: ShardEntry | None  # None when every sample of the unit was rejected


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

    def finished(self, run_dir: Path, index: int) -> ShardResult | None:
        return finished_unit(run_dir, index)

    def resume_warning(self, run_dir: Path, finished: Sequence[ShardResult]) -> str | None:
        return mixed_threads(run_dir, finished, self.metadata)


def finished_unit(run_dir: Path, index: int) -> ShardResult | None:
    """The result of a unit finished by an earlier invocation: its marker, sizes and sha256 all check out."""
    entry = completed_shard(run_dir, index, sha256=True)
    if entry is None:
        return None
    return ShardResult(index=index, entry=entry, rejects=read_rejects(rejects_path(run_dir, index)), skipped=True)


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
              captures: Mapping[str, Capture]) -> ShardResult:
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
        return ShardResult(index=index, entry=entry, rejects=rejects)

    def run_unit(self, run_dir: Path, index: int, samples: Sequence[PreparedSample]) -> ShardResult:
        return self.write(run_dir, index, samples, self.capture(samples))


def mixed_threads(run_dir: Path, finished: Sequence[ShardResult], metadata: Mapping[str, str]) -> str | None:
    """What a resume is about to mix, in one line: the finished shards' CPU threads (each shard's metadata) against
    this invocation's (`metadata`, its compact provenance), where both are recorded; None when nothing differs."""
    now = metadata.get(CPU_THREADS)
    if now is None:
        return None
    then: dict[str, list[str]] = {}
    for result in finished:
        if result.entry is None:
            continue
        rel = next(name for name in result.entry.files if name.endswith(".safetensors"))
        threads = read_header(run_dir / rel)[1].get(CPU_THREADS)
        if threads is not None and threads != now:
            then.setdefault(threads, []).append(result.entry.name)
    if not then:
        return None
    earlier = "; ".join(f"{', '.join(names)} with {threads}" for threads, names in sorted(then.items()))
    return (f"resuming with {now} CPU thread(s) per engine, but finished shards were captured with another count "
            f"({earlier}): bf16 CPU kernels reduce in another order on another count, so this run's shards may "
            f"differ in the last bits from an uninterrupted run's (each shard's metadata records its count); to keep "
            f"one count, rerun with OMP_NUM_THREADS={min(then)}, or replace the run with overwrite=true")
