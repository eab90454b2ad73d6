"""The capture stage: one work unit (the samples of one shard) -> engine batches -> validation -> one shard.

A stage knows nothing of how it is run (pipeline.run.contract); executors (local, Ray) hand it units and skip
finished ones. `compute` is the engine's capture, `write` validates every capture and writes the shard.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Mapping, Sequence

from pipeline.core.contracts import CPU_THREADS, Capture, PreparedSample, Reject
from pipeline.core.lifecycle import check_lease
from pipeline.core.stfile import read_header, read_header_ranged
from pipeline.core.storage import in_order
from pipeline.core.store_dir import StoreTarget
from pipeline.data.prepare import read_rejects, write_rejects
from pipeline.engines.base import Engine
from pipeline.points import Point
from pipeline.run.contract import RESUME_THREADS, UnitResult
from pipeline.shards.directory import RUN_DIR
from pipeline.shards.layout import rejects_path, shard_paths
from pipeline.shards.validate import capture_reject
from pipeline.shards.writer import ShardEntry, completed_shard, relative, shard_entry, write_shard


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
    # A run on object storage: where each unit is published once written in run_dir (then its local spool)
    target: StoreTarget | None = None

    def stage(self, engine: Engine) -> "CaptureStage":
        return CaptureStage(engine=engine, settings=self)

    def finished(self, run_dir: Path, index: int) -> ShardResult | None:
        return finished_unit(run_dir, index) if self.target is None else finished_on_store(self.target, run_dir, index)

    def resume_warning(self, run_dir: Path, finished: Sequence[ShardResult]) -> str | None:
        if self.target is None:
            return mixed_threads(lambda rel: read_header(run_dir / rel)[1], finished, self.metadata)
        store = self.target.store()

        def shard_metadata(rel: str) -> Mapping[str, str]:
            info = store.head(rel)  # there: the unit was judged finished from it just now
            return read_header_ranged(partial(store.get, rel), info.size if info else 0, f"{store.url}/{rel}")[1]
        return mixed_threads(shard_metadata, finished, self.metadata)

    def check_lease(self, run_dir: Path) -> None:
        """ClaimLost once another job holds the run (its directory's lease, or its store's)."""
        if self.target is None:
            check_lease(run_dir, self.lease_token, RUN_DIR)
        else:
            self.target.check_lease()


def finished_unit(run_dir: Path, index: int) -> ShardResult | None:
    """The result of a unit finished by an earlier invocation: its marker, sizes and sha256 all check out."""
    entry = completed_shard(run_dir, index, sha256=True)
    if entry is None:
        return None
    return ShardResult(index=index, entry=entry, rejects=read_rejects(rejects_path(run_dir, index)), skipped=True)


def finished_on_store(target: StoreTarget, spool: Path, index: int) -> ShardResult | None:
    """`finished_unit` of a run on object storage: its marker object and its files' sizes (their bytes were verified
    as they were uploaded); its rejects read back through the spool."""
    entry = shard_entry(target.finished(relative(spool, shard_paths(spool, index)["marker"])), index)
    if entry is None:
        return None
    path = rejects_path(spool, index)
    rejects = read_rejects(path) if target.fetch(relative(spool, path), path) else []
    path.unlink(missing_ok=True)
    return ShardResult(index=index, entry=entry, rejects=rejects, skipped=True)


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
        """The driver's half: validate every capture against its prepared sample, write the shard and its rejects (a
        run on object storage: into this node's spool; `publish` uploads them)."""
        cfg = self.settings
        run_dir = cfg.target.spool() if cfg.target is not None else run_dir
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
        cfg.check_lease(run_dir)
        # Capture rejects are written before the shard's completion marker, so a resumed run still reports them.
        if rejects:
            write_rejects(rejects_path(run_dir, index), rejects)
        else:  # a redone unit that rejects nothing now: an earlier attempt's rejects are not this shard's
            rejects_path(run_dir, index).unlink(missing_ok=True)
        entry = None
        if items:
            entry = write_shard(run_dir, index, items, points=[p.label for p in cfg.points],
                                storage_dtype=cfg.storage_dtype, metadata=cfg.metadata,
                                before_marker=partial(cfg.check_lease, run_dir))
        return ShardResult(index=index, entry=entry, rejects=rejects)

    def publish(self, run_dir: Path, result: ShardResult) -> ShardResult:
        """A unit written in the spool, published to the run's store: its rejects, its shard's files, its marker (on
        disk the unit is in place once written)."""
        if self.settings.target is None:
            return result
        spool, index = self.settings.target.spool(), result.index
        rejected = relative(spool, rejects_path(spool, index))
        files = ([rejected] if result.rejects else []) + (list(result.entry.files) if result.entry is not None else [])
        marker = relative(spool, shard_paths(spool, index)["marker"]) if result.entry is not None else None
        self.settings.target.publish(spool, files, marker, gone=[] if result.rejects else [rejected])
        return result

    def run_unit(self, run_dir: Path, index: int, samples: Sequence[PreparedSample]) -> ShardResult:
        return self.publish(run_dir, self.write(run_dir, index, samples, self.capture(samples)))


def mixed_threads(shard_metadata: Callable[[str], Mapping[str, str]], finished: Sequence[ShardResult],
                  metadata: Mapping[str, str]) -> str | None:
    """What a resume is about to mix, in one line: the finished shards' CPU threads (each shard's metadata, read by
    `shard_metadata` given the file's path in the run) against this invocation's (`metadata`, its compact
    provenance), where both are recorded; None when nothing differs."""
    now = metadata.get(CPU_THREADS)
    if now is None:
        return None
    entries = [result.entry for result in finished if result.entry is not None]

    def threads_of(entry: ShardEntry) -> str | None:
        return shard_metadata(next(name for name in entry.files if name.endswith(".safetensors"))).get(CPU_THREADS)
    then: dict[str, list[str]] = {}
    for entry, threads in zip(entries, in_order(threads_of, entries, threads=RESUME_THREADS)):  # a store: 2 requests
        if threads is not None and threads != now:
            then.setdefault(threads, []).append(entry.name)
    if not then:
        return None
    earlier = "; ".join(f"{', '.join(names)} with {threads}" for threads, names in sorted(then.items()))
    return (f"resuming with {now} CPU thread(s) per engine, but finished shards were captured with another count "
            f"({earlier}): bf16 CPU kernels reduce in another order on another count, so this run's shards may "
            f"differ in the last bits from an uninterrupted run's (each shard's metadata records its count); to keep "
            f"one count, rerun with OMP_NUM_THREADS={min(then)}, or replace the run with overwrite=true")
