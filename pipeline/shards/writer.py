"""Write one shard (safetensors + parquet + completion marker) from validated captures, atomically.

Order of writes, each temp-file-then-rename: the stale marker is removed first, then the .safetensors and the
.parquet, then the marker `shard-NNNNN.done.json` holding the ShardEntry. A shard is complete exactly when its
marker exists and the files have the recorded sizes, so a crash anywhere leaves a shard that a rerun redoes.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from pipeline.core.contracts import Capture, PreparedSample
from pipeline.core.io import atomic_path
from pipeline.core.outdir import clear_marker, file_records, remove_temps_of, unit_done, write_marker
from pipeline.core.stfile import StreamingWriter, TensorSpec
from pipeline.shards import layout
from pipeline.shards.storage import ShardEncoder, Storage, choose

Item = tuple[PreparedSample, Capture]


@dataclass(kw_only=True)
class ShardEntry:
    """One finished shard as recorded in its marker and in the manifest's `shards` list.

    files: path relative to the run dir -> {"sha256": hex, "bytes": size}.
    storage: how the hidden states are stored and, for fp8, the rounding error's sums (pipeline/shards/storage.py).
    """

    name: str
    num_samples: int
    num_tokens: int
    num_loss_tokens: int
    files: dict[str, dict[str, Any]]
    dtype: str
    points: list[str]
    storage: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ShardEntry":
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"shard entry has unknown fields {sorted(unknown)}")
        return cls(**data)


def _check_items(items: Sequence[Item], points: Sequence[str]) -> tuple[torch.dtype, int]:
    """Structural checks the file layout depends on (cheap); content checks live in validate.py."""
    if not items:
        raise ValueError("write_shard: items is empty; a shard holds at least one sample")
    first = items[0][1].hidden_states_TPH
    dtype, hidden_size = first.dtype, int(first.shape[-1])
    for sample, capture in items:
        hs = capture.hidden_states_TPH
        if sample.num_tokens < 1:  # offsets must strictly increase; empty samples are rejected upstream
            raise ValueError(f"sample {sample.sample_id}: num_tokens=0; a shard holds no empty samples")
        expected = (sample.num_tokens, len(points), hidden_size)
        if tuple(hs.shape) != expected:
            raise ValueError(f"sample {sample.sample_id}: hidden_states_TPH shape {tuple(hs.shape)} "
                             f"!= {expected} [T, P=len(points), H]")
        if hs.dtype != dtype:
            raise ValueError(f"sample {sample.sample_id}: hidden_states_TPH dtype {hs.dtype} != {dtype} "
                             "of the shard's first sample")
        if sample.loss_mask_T.shape != sample.input_ids_T.shape:
            raise ValueError(f"sample {sample.sample_id}: loss_mask_T shape {sample.loss_mask_T.shape} "
                             f"!= input_ids_T shape {sample.input_ids_T.shape}")
    return dtype, hidden_size


def _offsets(items: Sequence[Item]) -> np.ndarray:
    lengths = [sample.num_tokens for sample, _ in items]
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def _write_safetensors(path: Path, items: Sequence[Item], *, hidden_size: int, num_points: int,
                       storage: Storage, metadata: Mapping[str, str]) -> tuple[str, dict[str, Any]]:
    offsets = _offsets(items)
    num_tokens = int(offsets[-1])
    specs = [TensorSpec(name=layout.INPUT_IDS, dtype_code="I64", shape=(num_tokens,), num_bytes=8 * num_tokens),
             TensorSpec(name=layout.SAMPLE_OFFSETS, dtype_code="I64", shape=(len(offsets),),
                        num_bytes=8 * len(offsets)),
             *storage.hidden_specs(num_tokens, num_points, hidden_size),
             TensorSpec(name=layout.LOSS_MASK, dtype_code="U8", shape=(num_tokens,), num_bytes=num_tokens)]
    encoder = ShardEncoder(storage, num_points)
    # "r+b": the temp file is new and empty, and a truncating open makes ext4 flush it on close (auto_da_alloc).
    with open(path, "r+b") as f, StreamingWriter(f, specs, metadata) as out:
        for sample, _ in items:
            out.write_array(sample.input_ids_T.astype("<i8", copy=False))
        out.write_array(offsets.astype("<i8", copy=False))
        for sample, capture in items:  # one sample at a time: the writer never concatenates the shard
            for chunk in encoder.chunks(capture.hidden_states_TPH, sample.sample_id):
                out.write_chunk(chunk)
        for tensor in encoder.trailing():
            out.write_chunk(tensor)
        for sample, _ in items:
            out.write_array(sample.loss_mask_T.astype(np.uint8, copy=False))
        return out.close(), encoder.record()


def _parquet_table(items: Sequence[Item]) -> pa.Table:
    samples = [sample for sample, _ in items]
    offsets = _offsets(items)
    columns = {
        "sample_id": pa.array([s.sample_id for s in samples], pa.string()),
        "source": pa.array([s.source for s in samples], pa.string()),
        "row": pa.array([s.row for s in samples], pa.int64()),
        "offset": pa.array(offsets[:-1], pa.int64()),
        "num_tokens": pa.array([s.num_tokens for s in samples], pa.int64()),
        "num_loss_tokens": pa.array([s.num_loss_tokens for s in samples], pa.int64()),
        "truncated": pa.array([bool(s.truncated) for s in samples], pa.bool_()),
        "token_digest": pa.array([layout.token_digest(s.input_ids_T, s.loss_mask_T, int(offset))
                                  for s, offset in zip(samples, offsets[:-1])], pa.string()),
    }
    return pa.table(columns)


def _shard_metadata(points: Sequence[str], metadata: Mapping[str, str], storage: Storage) -> dict[str, str]:
    clash = sorted(set(metadata) & set(layout.RESERVED_METADATA))
    if clash:
        raise ValueError(f"metadata keys {clash} are reserved by the shard writer")
    bad = [k for k, v in metadata.items() if not (isinstance(k, str) and isinstance(v, str))]
    if bad:
        raise ValueError(f"metadata must map str to str; keys with other types: {bad}")
    return {**metadata, layout.META_POINTS: json.dumps(list(points)),
            layout.META_FORMAT_VERSION: layout.FORMAT_VERSION, layout.META_STORAGE: storage.metadata()}


def write_shard(run_dir: Path, index: int, items: Sequence[Item], *, points: Sequence[str],
                storage_dtype: str | None = None, metadata: Mapping[str, str] = {},
                before_marker: Callable[[], None] | None = None) -> ShardEntry:
    """Write shard `index` of `run_dir` from validated (sample, capture) pairs and return its entry.

    storage_dtype: None stores the capture dtype; "float8_e4m3fn" stores fp8 with per-row scales (storage.py).
    before_marker: called when the files are in place, before the marker makes the shard finished; raising there
    leaves the shard unfinished (the run directory's lock uses it).
    """
    points = [str(p) for p in points]  # labels; also accepts pipeline.points.Point objects
    dtype, hidden_size = _check_items(items, points)
    storage = choose(dtype, storage_dtype)
    st_meta = _shard_metadata(points, metadata, storage)
    paths = layout.shard_paths(run_dir, index)
    clear_marker(paths["marker"])
    remove_temps_of(paths.values())  # left by a killed writer of this shard: they would show up as unlisted files
    with atomic_path(paths["safetensors"]) as tmp:
        st_sha, stored = _write_safetensors(tmp, items, hidden_size=hidden_size, num_points=len(points),
                                            storage=storage, metadata=st_meta)
    with atomic_path(paths["parquet"]) as tmp:
        pq.write_table(_parquet_table(items), tmp)
    entry = ShardEntry(
        name=layout.shard_name(index), num_samples=len(items), num_tokens=int(_offsets(items)[-1]),
        num_loss_tokens=sum(sample.num_loss_tokens for sample, _ in items),
        files={relative(run_dir, paths["safetensors"]): {"sha256": st_sha,
                                                          "bytes": paths["safetensors"].stat().st_size},
               **file_records(run_dir, [paths["parquet"]])},
        dtype=storage.dtype, points=list(points), storage=stored)
    if before_marker is not None:
        before_marker()
    write_marker(paths["marker"], entry.to_dict())
    return entry


def relative(run_dir: Path, path: Path) -> str:
    """`path` as a run names its files: relative to the run directory, with forward slashes."""
    return path.relative_to(Path(run_dir)).as_posix()


def completed_shard(run_dir: Path, index: int, *, sha256: bool = False) -> ShardEntry | None:
    """The entry of shard `index` if it is done (pipeline.core.outdir.unit_done: its marker, the files' sizes and,
    with `sha256`, their digests), else None."""
    return shard_entry(unit_done(run_dir, layout.shard_paths(run_dir, index)["marker"], sha256=sha256), index)


def shard_entry(record: Mapping[str, Any] | None, index: int) -> ShardEntry | None:
    """Shard `index`'s entry from the record of its marker; None for none, or one of another shape or shard (the
    shard is redone)."""
    try:
        entry = ShardEntry.from_dict(record) if record is not None else None
    except (ValueError, TypeError):
        return None
    if entry is None or entry.name != layout.shard_name(index):
        return None
    return entry
