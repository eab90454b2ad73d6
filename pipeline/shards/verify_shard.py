"""Content checks of one shard against its manifest entry: header, offsets, finiteness, Parquet rows.

The header is read twice, by the pipeline's own parser (the writer's) and by the safetensors library, and the two
must agree; every tensor checked is read through the library (st_library.py), hidden states chunk by chunk, so
verifying a run needs memory of one chunk, not of one shard.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

from pipeline.core.jsonfile import parse
from pipeline.core.stfile import TensorInfo, read_header
from pipeline.shards import layout
from pipeline.shards.formats import row_digest, shard_storage
from pipeline.shards.st_library import LibraryRejects, header_disagreements, read_library_header, read_rows, read_small
from pipeline.shards.storage import SCALE_DTYPE, Storage
from pipeline.shards.writer import ShardEntry

_CHUNK_ELEMENTS = 8 << 20  # hidden-state values per finiteness chunk (32 MiB once widened to float32)
_MAX_LISTED = 3  # per kind of row mismatch, list this many and count the rest


@dataclass(frozen=True, kw_only=True)
class Expected:
    """What the manifest says every shard must look like."""

    points: list[str]
    hidden_size: int
    dtype: str
    storage: Storage
    version: str = layout.FORMAT_VERSION  # the manifest's: every shard of a run carries it
    provenance: dict[str, str] | None = None  # the shard metadata the manifest's provenance implies (None: no record)


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def _header_problems(name: str, infos: dict[str, TensorInfo], meta: dict[str, str], entry: ShardEntry,
                     expect: Expected) -> list[str]:
    names = expect.storage.tensor_names
    if sorted(infos) != sorted(names):
        return [f"{name}: tensors {sorted(infos)} != expected {sorted(names)} ({expect.storage.dtype} storage)"]
    hidden_dtype, hidden_code = layout.HIDDEN_DTYPES[expect.dtype]
    num_tokens, num_samples, num_points = entry.num_tokens, entry.num_samples, len(expect.points)
    want = {layout.HIDDEN_STATES: (hidden_code, (num_tokens, num_points, expect.hidden_size), hidden_dtype),
            layout.INPUT_IDS: ("I64", (num_tokens,), torch.int64),
            layout.LOSS_MASK: ("U8", (num_tokens,), torch.uint8),
            layout.SAMPLE_OFFSETS: ("I64", (num_samples + 1,), torch.int64)}
    if expect.storage.scaled:
        want[layout.HIDDEN_SCALES] = ("F32", (num_tokens, num_points), SCALE_DTYPE)
    problems = []
    for tensor, (code, shape, dtype) in want.items():
        info = infos[tensor]
        if info.dtype_code != code:
            problems.append(f"{name}: {tensor} dtype {info.dtype_code} != expected {code}")
        if info.shape != shape:
            problems.append(f"{name}: {tensor} shape {list(info.shape)} != expected {list(shape)} from manifest")
        elif info.end - info.start != math.prod(shape) * _itemsize(dtype):
            problems.append(f"{name}: {tensor} spans {info.end - info.start} bytes, shape needs "
                            f"{math.prod(shape) * _itemsize(dtype)}")
    return problems + _metadata_problems(name, meta, expect)


def _metadata_problems(name: str, meta: dict[str, str], expect: Expected) -> list[str]:
    problems = []
    raw = meta.get(layout.META_POINTS, "null")
    try:
        points = parse(raw, ValueError, where="it")  # bounded in size and nesting
    except ValueError as exc:
        problems.append(f"{name}: metadata points {_short(raw)} != manifest points {expect.points} ({exc})")
    else:
        if points != expect.points:
            problems.append(f"{name}: metadata points {points} != manifest points {expect.points}")
    try:
        storage = shard_storage(meta.get(layout.META_STORAGE), expect.version, expect.storage)
    except ValueError as exc:
        problems.append(f"{name}: metadata storage: {exc}")
    else:
        if storage != expect.storage:
            problems.append(f"{name}: metadata storage {storage.to_dict()} != manifest storage "
                            f"{expect.storage.to_dict()}")
    version = meta.get(layout.META_FORMAT_VERSION)
    if version != expect.version:
        problems.append(f"{name}: metadata format_version={version!r} != the manifest's {expect.version!r}")
    for key, want in (expect.provenance or {}).items():
        got = meta.get(key)
        if got != want:
            problems.append(f"{name}: metadata {key} {_short(got)} != the manifest's provenance {_short(want)} (a "
                            "shard written by another engine, model or code version than the run)")
    return problems


def _short(text: str | None, limit: int = 160) -> str:
    return repr(text) if text is None or len(text) <= limit else repr(text[:limit] + "...")


def _offset_problems(name: str, offsets: np.ndarray, num_tokens: int) -> list[str]:
    if offsets.size == 0 or offsets[0] != 0:
        return [f"{name}: sample_offsets must start at 0, starts at {offsets[:1].tolist()}"]
    steps = np.diff(offsets)
    if (steps <= 0).any():
        i = int(np.flatnonzero(steps <= 0)[0])
        return [f"{name}: sample_offsets not increasing at sample {i}: {offsets[i]} -> {offsets[i + 1]}"]
    if offsets[-1] != num_tokens:
        return [f"{name}: sample_offsets end at {offsets[-1]}, hidden_states has {num_tokens} tokens"]
    return []


def _non_finite(path: Path, infos: dict[str, TensorInfo], storage: Storage) -> tuple[int, int, int, list[str]]:
    """(count, first flat token row, first point index) of non-finite hidden-state values as the reader returns them
    (fp8: dequantized), streamed in chunks; and the problems of fp8 scales (each must be finite and positive)."""
    num_tokens, num_points, hidden = infos[layout.HIDDEN_STATES].shape
    rows_per_chunk = max(1, _CHUNK_ELEMENTS // max(1, num_points * hidden))
    count, first_row, first_point, bad_scales, first_scale = 0, -1, -1, 0, None
    for start in range(0, num_tokens, rows_per_chunk):
        rows = min(rows_per_chunk, num_tokens - start)
        chunk = read_rows(path, layout.HIDDEN_STATES, start, rows)
        scales = None
        if storage.scaled:
            scales = read_rows(path, layout.HIDDEN_SCALES, start, rows)
            wrong = ~(torch.isfinite(scales) & (scales > 0))
            if (num_wrong := int(wrong.sum())) and first_scale is None:
                row, point = torch.nonzero(wrong)[0].tolist()
                first_scale = (start + row, point, float(scales[row, point]))
            bad_scales += num_wrong
        values = storage.decode(chunk, scales)
        # fp8 has no isfinite kernel; widening per chunk keeps the cost at one chunk.
        bad = ~torch.isfinite(values.float() if values.element_size() == 1 else values)
        num_bad = int(bad.sum())
        if num_bad and first_row < 0:
            row, point = torch.nonzero(bad.any(dim=2))[0].tolist()
            first_row, first_point = start + row, point
        count += num_bad
    problems = [] if first_scale is None else [
        f"{bad_scales} {layout.HIDDEN_SCALES} value(s) not finite and positive, first at token {first_scale[0]}, "
        f"point index {first_scale[1]}: {first_scale[2]!r}"]
    return count, first_row, first_point, problems


def _row_mismatches(name: str, column: str, ids: list[str], got: np.ndarray, want: np.ndarray) -> list[str]:
    bad = np.flatnonzero(got != want)
    listed = [f"{name}: {column} of sample {ids[i]!r} (row {i}) is {got[i]}, safetensors says {want[i]}"
              for i in bad[:_MAX_LISTED]]
    if bad.size > _MAX_LISTED:
        listed.append(f"{name}: {column} differs for {bad.size - _MAX_LISTED} more sample(s)")
    return listed


def _mask_problems(name: str, loss_mask: np.ndarray) -> list[str]:
    bad = np.flatnonzero(loss_mask > 1)
    if bad.size:
        return [f"{name}: {bad.size} loss_mask value(s) not 0 or 1, first at token {int(bad[0])}: "
                f"{int(loss_mask[bad[0]])}"]
    return []


def _parquet_problems(name: str, table: dict[str, list], entry: ShardEntry, offsets: np.ndarray,
                      input_ids: np.ndarray, loss_mask: np.ndarray, version: str) -> list[str]:
    if sorted(table) != sorted(layout.PARQUET_COLUMNS):
        return [f"{name}: columns {sorted(table)} != expected {sorted(layout.PARQUET_COLUMNS)}"]
    ids = table["sample_id"]
    if len(ids) != len(offsets) - 1:
        return [f"{name}: {len(ids)} rows, safetensors holds {len(offsets) - 1} samples"]
    loss_cum = np.concatenate([[0], np.cumsum(loss_mask, dtype=np.int64)])
    want_loss = loss_cum[offsets[1:]] - loss_cum[offsets[:-1]]
    digest = row_digest(version)  # version 3: ids, loss mask, offset and length; 1 and 2: the ids alone
    digests = [digest(input_ids[a:b], loss_mask[a:b], int(a)) for a, b in zip(offsets[:-1], offsets[1:])]
    problems = (_row_mismatches(name, "offset", ids, np.asarray(table["offset"]), offsets[:-1])
                + _row_mismatches(name, "num_tokens", ids, np.asarray(table["num_tokens"]), np.diff(offsets))
                + _row_mismatches(name, "num_loss_tokens", ids, np.asarray(table["num_loss_tokens"]), want_loss)
                + _row_mismatches(name, "token_digest", ids, np.asarray(table["token_digest"]), np.asarray(digests)))
    if int(want_loss.sum()) != entry.num_loss_tokens:
        problems.append(f"{name}: {int(want_loss.sum())} loss tokens, manifest entry says {entry.num_loss_tokens}")
    return problems


def _headers(st_path: Path, name: str) -> tuple[dict[str, TensorInfo], dict[str, str]] | list[str]:
    """The header as the pipeline's parser reads it, once the safetensors library has read the same; else the
    problems: either one refusing the file, or the two reading it differently."""
    own, infos, meta = None, {}, {}
    try:
        infos, meta = read_header(st_path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        own = f"{type(exc).__name__}: {exc}"
    try:
        library = read_library_header(st_path)
    except (OSError, LibraryRejects) as exc:
        if own is not None:
            return [f"{name}: unreadable ({own}; the safetensors library: {exc})"]
        return [f"{name}: the safetensors library rejects {st_path.name} ({exc}), though the pipeline's own parser "
                "reads it"]
    if own is not None:
        return [f"{name}: unreadable by the pipeline's own parser ({own}), though the safetensors library reads "
                f"{st_path.name}"]
    return header_disagreements(f"{name}: {st_path.name}", infos, meta, library) or (infos, meta)


def check_shard(st_path: Path, pq_path: Path, entry: ShardEntry,
                expect: Expected) -> tuple[list[str], dict[str, list]]:
    """(problems, Parquet rows by column) of one shard; no rows when the shard cannot be read."""
    name = entry.name
    headers = _headers(st_path, name)
    if isinstance(headers, list):
        return headers, {}
    infos, meta = headers
    problems = _header_problems(name, infos, meta, entry, expect)  # the two parsers agree: one check covers both
    if problems:
        return problems, {}
    try:
        offsets, input_ids, loss_mask = read_small(st_path, layout.SAMPLE_OFFSETS, layout.INPUT_IDS, layout.LOSS_MASK)
        problems = _offset_problems(name, offsets, entry.num_tokens)
        count, row, point, scale_problems = _non_finite(st_path, infos, expect.storage)
        problems += [f"{name}: {p}" for p in scale_problems]
        table = pq.read_table(pq_path).to_pydict()
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
        return [f"{name}: unreadable ({type(exc).__name__}: {exc})"], {}
    ids = table.get("sample_id", [])
    if count:
        owner = int(np.searchsorted(offsets, row, side="right")) - 1
        who = repr(ids[owner]) if 0 <= owner < len(ids) else f"#{owner}"
        problems.append(f"{name}: {count} non-finite hidden state value(s), first at token {row} "
                        f"(sample {who}, point {expect.points[point]!r})")
    problems += _mask_problems(name, loss_mask)
    if not problems:
        problems += _parquet_problems(name, table, entry, offsets, input_ids, loss_mask, expect.version)
    return problems, table
