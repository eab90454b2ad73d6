"""Reading the records of a prompt file (JSONL, JSON, Parquet; compressed or not), each bounded as it is read.

A record comes as a `RawRecord`: its decoded value, or why it could not be read. A JSONL line longer than the record
bound (`pipeline/data/bounds.py`) is measured in 1 MiB steps and skipped without being held, a Parquet row or a JSON
array element is measured once decoded, and JSON nested deeper than `MAX_JSON_DEPTH` (or deeper than Python's decoder
follows) is `too_deep`: each is that record's reject, never the file's end.
"""
from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.data.bounds import MAX_JSON_DEPTH
from pipeline.data.compression import codec_of, format_suffix, open_data, read_all

PARQUET_BATCH_ROWS = 256
_SKIP_STEP = 1 << 20  # bytes read at a time while skipping a line that is over the record bound
# A JSON string or a bracket: enough to find where an array element ends when it is too deep to decode.
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


@dataclass(frozen=True, slots=True)
class RawRecord:
    """One record as read: `value` is the decoded object, or `error` says why the line did not decode (`reason`: the
    Reject code; `too_long` for a record over the bound, which was not read)."""

    row: int
    value: Any = None
    error: str | None = None
    reason: str = "malformed_json"


def parquet_file(path: Path) -> pq.ParquetFile:
    """Plain Parquet is read in place; a compressed copy (Parquet compresses its own columns) is decompressed first."""
    return pq.ParquetFile(path if codec_of(path) is None else pa.BufferReader(read_all(path)))


def iter_records(path: Path, max_record_bytes: int | None = None) -> Iterator[RawRecord]:
    """Records in file order, row numbers counting records (blank lines are not records); a record larger than
    `max_record_bytes` comes as a `too_long` error naming its size."""
    suffix = format_suffix(path)
    if suffix == ".parquet":
        records = _iter_parquet(path)
    elif suffix == ".json":
        records = _iter_json(path, max_record_bytes)
    else:
        with open_data(path) as f:
            yield from _iter_jsonl(f, max_record_bytes)
        return
    for record in records:
        yield _bounded(record, max_record_bytes)


def _iter_jsonl(f: BinaryIO, max_record_bytes: int | None = None) -> Iterator[RawRecord]:
    row = line_number = 0
    while raw := f.readline(-1 if max_record_bytes is None else max_record_bytes + 1):
        line_number += 1
        if max_record_bytes is not None and len(raw) > max_record_bytes and not raw.endswith(b"\n"):
            size = len(raw) + _skip_line(f)
            yield RawRecord(row, reason="too_long", error=f"line {line_number}: the record is {size:,} bytes, more "
                                                          f"than the {max_record_bytes:,} one record may take")
            row += 1
            continue
        if not raw.strip():
            continue
        yield _decode_line(raw, line_number, row)
        row += 1


def _skip_line(f: BinaryIO) -> int:
    """Read past the rest of the current line a step at a time; its length in bytes, without the newline."""
    size = 0
    while chunk := f.readline(_SKIP_STEP):
        if chunk.endswith(b"\n"):
            return size + len(chunk) - 1
        size += len(chunk)
    return size


def _decode_line(raw: bytes, line_number: int, row: int) -> RawRecord:
    try:
        return RawRecord(row, value=json.loads(raw.decode("utf-8-sig" if line_number == 1 else "utf-8")))
    except UnicodeDecodeError as e:
        return RawRecord(row, error=f"line {line_number}: not valid UTF-8 at byte {e.start}")
    except json.JSONDecodeError as e:
        return RawRecord(row, error=f"line {line_number}: {e.msg} at column {e.colno}")
    except RecursionError:
        return RawRecord(row, reason="too_deep", error=f"line {line_number}: the JSON nests deeper than the decoder "
                                                       f"follows (more than {MAX_JSON_DEPTH} levels are refused)")


def _iter_json(path: Path, max_record_bytes: int | None) -> Iterator[RawRecord]:
    """A .json file is an array of records, a single record, or (as many exports are) JSON Lines. It has no record
    boundaries before it decodes, so it is read whole (an array too deep to decode at once: element by element)."""
    raw = read_all(path)
    try:
        value = json.loads(raw.decode("utf-8-sig"))
    except RecursionError:
        if raw.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"["):
            yield from _iter_array(raw.decode("utf-8-sig"), path)
        else:
            yield RawRecord(0, reason="too_deep", error=f"the JSON nests deeper than the decoder follows (more than "
                                                        f"{MAX_JSON_DEPTH} levels are refused)")
        return
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        if raw.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"["):
            # An array has no per-record boundaries to recover from, so a malformed one fails the whole file.
            raise ValueError(f"{path}: not a valid JSON array: {e}") from e
        yield from _iter_jsonl(io.BytesIO(raw), max_record_bytes)
        return
    for row, record in enumerate(value if isinstance(value, list) else [value]):
        yield RawRecord(row, value=record)


def _iter_array(text: str, path: Path) -> Iterator[RawRecord]:
    """A JSON array's elements one at a time, so that one nested too deeply to decode is that element's reject."""
    decoder, row = json.JSONDecoder(), 0
    index = _skip_space(text, text.index("[") + 1)
    while index < len(text) and text[index] != "]":
        try:
            value, end = decoder.raw_decode(text, index)
            record = RawRecord(row, value=value)
        except RecursionError:
            end = _element_end(text, index, path)
            record = RawRecord(row, reason="too_deep", error=f"element {row} nests deeper than the decoder follows "
                                                             f"(more than {MAX_JSON_DEPTH} levels are refused)")
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not a valid JSON array: {e}") from e
        yield record
        row += 1
        index = _skip_space(text, end)
        if index < len(text) and text[index] == ",":
            index = _skip_space(text, index + 1)
    if index >= len(text):
        raise ValueError(f"{path}: not a valid JSON array: it is not closed")


def _skip_space(text: str, index: int) -> int:
    while index < len(text) and text[index] in " \t\r\n":
        index += 1
    return index


def _element_end(text: str, start: int, path: Path) -> int:
    """Where the array or object starting at `start` ends (its brackets counted outside strings)."""
    depth = 0
    for match in _JSON_TOKEN.finditer(text, start):
        token = match.group()
        depth += 1 if token in "[{" else -1 if token in "]}" else 0
        if depth == 0:
            return match.end()
    raise ValueError(f"{path}: not a valid JSON array: element at character {start} is not closed")


def _bounded(record: RawRecord, max_record_bytes: int | None) -> RawRecord:
    """A decoded record (a Parquet row, a JSON array element) measured against the bound: its text, in characters
    (at most its size in bytes), and its nesting."""
    if record.error is not None:
        return record
    chars, depth = measure(record.value, max_record_bytes)
    if depth > MAX_JSON_DEPTH:
        return RawRecord(record.row, reason="too_deep", error=f"the record nests more than {MAX_JSON_DEPTH} levels")
    if max_record_bytes is not None and chars > max_record_bytes:
        return RawRecord(record.row, reason="too_long", error=f"the record holds {chars:,}+ characters, more than the "
                                                              f"{max_record_bytes:,} one record may take")
    return record


def measure(value: Any, max_chars: int | None = None) -> tuple[int, int]:
    """(characters of every string and key, nesting depth) of a decoded record, walked without recursion; the walk
    stops once the characters pass `max_chars` or the depth passes MAX_JSON_DEPTH."""
    chars, depth, stack = 0, 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, str):
            chars += len(node)
        elif isinstance(node, (dict, list)):
            depth = max(depth, level)
            items = [*node.keys(), *node.values()] if isinstance(node, dict) else node
            stack.extend((item, level + 1) for item in items)
        if depth > MAX_JSON_DEPTH or (max_chars is not None and chars > max_chars):
            break
    return chars, depth


def _iter_parquet(path: Path) -> Iterator[RawRecord]:
    row = 0
    for batch in parquet_file(path).iter_batches(batch_size=PARQUET_BATCH_ROWS):
        for value in batch.to_pylist():
            yield RawRecord(row, value=value)
            row += 1
