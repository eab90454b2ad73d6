"""Write one shard (safetensors + parquet + completion marker) from validated captures, atomically.

Order of writes, each temp-file-then-rename: the stale marker is removed first, then the .safetensors and the
.parquet, then the marker `shard-NNNNN.done.json` holding the ShardEntry. A shard is complete exactly when its
marker exists and the files have the recorded sizes, so a crash anywhere leaves a shard that a rerun redoes.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from pipeline.core.contracts import Capture, PreparedSample
from pipeline.core.faults import fault_point
from pipeline.core.io import atomic_path, sha256_file, write_text_atomic
from pipeline.core.stfile import StreamingWriter, TensorSpec
from pipeline.shards import layout
from pipeline.shards.validate import all_finite

Item = tuple[PreparedSample, Capture]


@dataclass(kw_only=True)
class ShardEntry:
    """One finished shard as recorded in its marker and in the manifest's `shards` list.

    files: path relative to the run dir -> {"sha256": hex, "bytes": size}.
    num_saturated: hidden-state values clipped to the storage dtype's range (only fp8 storage clips; recorded
    rather than silent).
    """

    name: str
    num_samples: int
    num_tokens: int
    num_loss_tokens: int
    files: dict[str, dict[str, Any]]
    dtype: str
    points: list[str]
    num_saturated: int = 0

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


def _storage_dtype(capture_dtype: torch.dtype, storage_dtype: str | None) -> tuple[str, torch.dtype, str]:
    name = layout.dtype_name(capture_dtype) if storage_dtype is None else storage_dtype
    if name not in layout.HIDDEN_DTYPES:
        raise ValueError(f"storage_dtype={name!r} is not supported; choose from {', '.join(layout.HIDDEN_DTYPES)}")
    torch_dtype, code = layout.HIDDEN_DTYPES[name]
    return name, torch_dtype, code


def _cast(hs: torch.Tensor, target: torch.dtype, sample_id: str) -> tuple[torch.Tensor, int]:
    """Cast one sample's states to the storage dtype; count values clipped by fp8, refuse anything non-finite."""
    if hs.dtype == target:
        return hs, 0
    stored = hs.to(target)
    num_saturated = 0
    if target == torch.float8_e4m3fn:
        # torch saturates out-of-range values to +-448 instead of failing, so count them to make the loss visible.
        num_saturated = int((hs.abs() > torch.finfo(target).max).sum())
    elif not all_finite(stored):
        raise ValueError(f"sample {sample_id}: casting {hs.dtype} to {target} overflowed "
                         f"(max |x| = {float(hs.abs().max()):.4g})")
    return stored, num_saturated


def _offsets(items: Sequence[Item]) -> np.ndarray:
    lengths = [sample.num_tokens for sample, _ in items]
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def _write_safetensors(path: Path, items: Sequence[Item], *, hidden_size: int, num_points: int,
                       storage: tuple[str, torch.dtype, str], metadata: Mapping[str, str]) -> tuple[str, int]:
    name, torch_dtype, code = storage
    offsets = _offsets(items)
    num_tokens, item_bytes = int(offsets[-1]), torch.empty(0, dtype=torch_dtype).element_size()
    specs = [TensorSpec(name=layout.INPUT_IDS, dtype_code="I64", shape=(num_tokens,), num_bytes=8 * num_tokens),
             TensorSpec(name=layout.SAMPLE_OFFSETS, dtype_code="I64", shape=(len(offsets),),
                        num_bytes=8 * len(offsets)),
             TensorSpec(name=layout.HIDDEN_STATES, dtype_code=code, shape=(num_tokens, num_points, hidden_size),
                        num_bytes=num_tokens * num_points * hidden_size * item_bytes),
             TensorSpec(name=layout.LOSS_MASK, dtype_code="U8", shape=(num_tokens,), num_bytes=num_tokens)]
    num_saturated = 0
    # "r+b": the temp file is new and empty, and a truncating open makes ext4 flush it on close (auto_da_alloc).
    with open(path, "r+b") as f, StreamingWriter(f, specs, metadata) as out:
        for sample, _ in items:
            out.write_array(sample.input_ids_T.astype("<i8", copy=False))
        out.write_array(offsets.astype("<i8", copy=False))
        for sample, capture in items:  # one sample at a time: the writer never concatenates the shard
            stored, saturated = _cast(capture.hidden_states_TPH, torch_dtype, sample.sample_id)
            out.write_chunk(stored)
            num_saturated += saturated
        for sample, _ in items:
            out.write_array(sample.loss_mask_T.astype(np.uint8, copy=False))
        return out.close(), num_saturated


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
        "token_digest": pa.array([layout.token_digest(s.input_ids_T) for s in samples], pa.string()),
    }
    return pa.table(columns)


def _shard_metadata(points: Sequence[str], metadata: Mapping[str, str]) -> dict[str, str]:
    clash = sorted(set(metadata) & set(layout.RESERVED_METADATA))
    if clash:
        raise ValueError(f"metadata keys {clash} are reserved by the shard writer")
    bad = [k for k, v in metadata.items() if not (isinstance(k, str) and isinstance(v, str))]
    if bad:
        raise ValueError(f"metadata must map str to str; keys with other types: {bad}")
    return {**metadata, layout.META_POINTS: json.dumps(list(points)),
            layout.META_FORMAT_VERSION: layout.FORMAT_VERSION}


def write_shard(run_dir: Path, index: int, items: Sequence[Item], *, points: Sequence[str],
                storage_dtype: str | None = None, metadata: Mapping[str, str] = {},
                before_marker: Callable[[], None] | None = None) -> ShardEntry:
    """Write shard `index` of `run_dir` from validated (sample, capture) pairs and return its entry.

    storage_dtype: None stores the capture dtype; a dtype name (e.g. "float8_e4m3fn") casts sample by sample.
    before_marker: called when the files are in place, before the marker makes the shard finished; raising there
    leaves the shard unfinished (the run directory's lock uses it).
    """
    points = [str(p) for p in points]  # labels; also accepts pipeline.points.Point objects
    dtype, hidden_size = _check_items(items, points)
    storage = _storage_dtype(dtype, storage_dtype)
    st_meta = _shard_metadata(points, metadata)
    paths = layout.shard_paths(run_dir, index)
    paths["marker"].unlink(missing_ok=True)  # from here on the shard counts as unfinished
    fault_point("unlink", paths["marker"].name)
    _remove_stale_temps(paths)
    with atomic_path(paths["safetensors"]) as tmp:
        st_sha, num_saturated = _write_safetensors(tmp, items, hidden_size=hidden_size, num_points=len(points),
                                                   storage=storage, metadata=st_meta)
    with atomic_path(paths["parquet"]) as tmp:
        pq.write_table(_parquet_table(items), tmp)
    entry = ShardEntry(
        name=layout.shard_name(index), num_samples=len(items), num_tokens=int(_offsets(items)[-1]),
        num_loss_tokens=sum(sample.num_loss_tokens for sample, _ in items),
        files={_relative(run_dir, paths["safetensors"]): {"sha256": st_sha,
                                                          "bytes": paths["safetensors"].stat().st_size},
               _relative(run_dir, paths["parquet"]): {"sha256": sha256_file(paths["parquet"]),
                                                      "bytes": paths["parquet"].stat().st_size}},
        dtype=storage[0], points=list(points), num_saturated=num_saturated)
    if before_marker is not None:
        before_marker()
    write_text_atomic(paths["marker"], json.dumps(entry.to_dict(), sort_keys=True, indent=2) + "\n")
    return entry


def _relative(run_dir: Path, path: Path) -> str:
    return path.relative_to(Path(run_dir)).as_posix()


def _remove_stale_temps(paths: Mapping[str, Path]) -> None:
    """Temp files left by a killed writer of this shard would otherwise show up as unlisted files."""
    for path in paths.values():
        for stale in path.parent.glob(f".{path.name}.*.tmp"):
            stale.unlink(missing_ok=True)


def completed_shard(run_dir: Path, index: int) -> ShardEntry | None:
    """The entry of shard `index` if its marker exists and its files have the recorded sizes, else None."""
    marker = layout.shard_paths(run_dir, index)["marker"]
    try:
        entry = ShardEntry.from_dict(json.loads(marker.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None  # no marker, or one torn by a crash: the shard is redone
    if entry.name != layout.shard_name(index):
        return None
    for rel, info in entry.files.items():
        path = Path(run_dir) / rel
        if not path.is_file() or path.stat().st_size != info.get("bytes"):
            return None
    return entry
