"""The capture stage: one work unit (the samples of one shard) -> engine batches -> validation -> one shard.

A stage knows nothing of how it is run; executors (local here, Ray later) hand it units and skip finished ones.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from pipeline.data.prepare import read_rejects, write_rejects
from pipeline.data.sample import PreparedSample, Reject
from pipeline.engines.base import Engine
from pipeline.points import Point
from pipeline.shards.layout import shard_name
from pipeline.shards.validate import capture_reject
from pipeline.shards.writer import ShardEntry, completed_shard, write_shard

CAPTURE_REJECTS_DIR = "rejects"


@dataclass(kw_only=True)
class UnitResult:
    index: int
    entry: ShardEntry | None  # None when every sample of the unit was rejected
    rejects: list[Reject] = field(default_factory=list)
    skipped: bool = False  # finished by an earlier invocation


def _batches(samples: Sequence[PreparedSample], batch_size: int) -> list[list[PreparedSample]]:
    # Similar lengths batch together to cut padding; results are put back in unit order before writing.
    ordered = sorted(samples, key=lambda s: s.num_tokens)
    return [ordered[i: i + batch_size] for i in range(0, len(ordered), batch_size)]


def _rejects_path(run_dir: Path, index: int) -> Path:
    return run_dir / CAPTURE_REJECTS_DIR / f"{shard_name(index)}.parquet"


@dataclass(kw_only=True)
class CaptureStage:
    engine: Engine
    points: list[Point]
    hidden_size: int
    batch_size: int
    storage_dtype: str | None
    metadata: Mapping[str, str]

    def done(self, run_dir: Path, index: int) -> UnitResult | None:
        entry = completed_shard(run_dir, index)
        if entry is None:
            return None
        return UnitResult(index=index, entry=entry, rejects=read_rejects(_rejects_path(run_dir, index)),
                          skipped=True)

    def run_unit(self, run_dir: Path, index: int, samples: Sequence[PreparedSample]) -> UnitResult:
        captures = {}
        for batch in _batches(samples, self.batch_size):
            for sample, capture in zip(batch, self.engine.capture(batch)):
                captures[sample.sample_id] = capture
        items, rejects = [], []
        for sample in samples:
            capture = captures.get(sample.sample_id)
            reject = None if capture is not None else Reject(
                source=sample.source, row=sample.row, sample_id=sample.sample_id, reason="not_captured",
                detail="the engine returned no result for this sample")
            reject = reject or capture_reject(sample, capture, num_points=len(self.points),
                                              hidden_size=self.hidden_size)
            if reject is not None:
                rejects.append(reject)
            else:
                items.append((sample, capture))
        # Capture rejects are written before the shard's completion marker, so a resumed run still reports them.
        if rejects:
            write_rejects(_rejects_path(run_dir, index), rejects)
        entry = None
        if items:
            entry = write_shard(run_dir, index, items, points=[p.label for p in self.points],
                                storage_dtype=self.storage_dtype, metadata=self.metadata)
        return UnitResult(index=index, entry=entry, rejects=rejects)
