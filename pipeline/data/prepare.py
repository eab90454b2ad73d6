"""Data preparation: records -> token ids + assistant loss mask, with a length policy and a reason for every reject.

Token ids come from the target's own chat template, rendered exactly as `apply_chat_template` renders it, so the
ids captured here are the ids a serving engine would see for the same conversation. Every record is bounded before
it is tokenised (`pipeline/data/bounds.py`), and whatever fails on one record is that record's reject: the data set
goes on.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.core.cli import UsageError
from pipeline.core.contracts import PreparedSample, Reject
from pipeline.core.io import atomic_path
from pipeline.data.bounds import RecordBounds
from pipeline.data.mask import ChatTokenizer, MaskOptions
from pipeline.data.reading import Source, read_each, source_of
from pipeline.data.records import RawRecord
from pipeline.data.sources import RecordError, parse_record

LengthPolicy = Literal["truncate", "reject"]
LENGTH_POLICIES = ("truncate", "reject")
REJECTS_SCHEMA = pa.schema(
    [
        ("source", pa.string()),
        ("row", pa.int64()),
        ("sample_id", pa.string()),
        ("reason", pa.string()),
        ("detail", pa.string()),
    ]
)


class NoValidRecords(UsageError):
    """The data holds no record a job can use (extract: capture; regenerate: regenerate); the rejects say why."""


@dataclass
class PreparedData:
    """What one data file became: samples in file order, rejects in file order, the file's sha256, and how the loss
    mask was made (method and options, for provenance)."""

    source: str
    source_digest: str
    loss_mask: dict[str, Any] = field(default_factory=dict)
    samples: list[PreparedSample] = field(default_factory=list)
    rejects: list[Reject] = field(default_factory=list)
    # data from a regeneration directory: who wrote the answers (pipeline.run.answers), for provenance
    regeneration: dict[str, Any] | None = None


def prepare(
    path: str | Path,
    tokenizer: Any,
    *,
    max_length: int,
    length_policy: LengthPolicy,
    limit: int | None = None,
    mask: MaskOptions | None = None,
) -> PreparedData:
    """Tokenize every record of `path`; stop once `limit` samples are accepted (rejects do not count)."""
    _check_options(max_length, length_policy, limit)
    source = source_of(path, tokenizer, max_length)
    chat = ChatTokenizer(tokenizer, mask)
    data = PreparedData(source=source.name, source_digest=source.digest, loss_mask=chat.record())
    keep = functools.partial(_prepare_record, source=source, chat=chat, length_policy=length_policy)
    for result in read_each(source, keep, limit=limit):
        (data.samples if isinstance(result, PreparedSample) else data.rejects).append(result)
    return data


def _check_options(max_length: int, length_policy: str, limit: int | None) -> None:
    if not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"max_length must be a positive integer, got {max_length!r}")
    if length_policy not in LENGTH_POLICIES:
        raise ValueError(f"length_policy must be one of {LENGTH_POLICIES}, got {length_policy!r}")
    if limit is not None and (not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be None or a non-negative integer, got {limit!r}")


def _prepare_record(record: RawRecord, sample_id: str, *, source: Source, chat: ChatTokenizer,
                    length_policy: str) -> PreparedSample:
    """One record as a sample; RecordError when it cannot be one."""
    input_ids, loss_mask, cut = _tokenize(chat, parse_record(record.value), source.bounds, length_policy)
    input_ids, loss_mask, truncated = _apply_length_policy(input_ids, loss_mask, source.bounds.max_length,
                                                           length_policy, cut)
    return PreparedSample(
        sample_id=sample_id,
        source=source.name,
        row=record.row,
        input_ids_T=np.asarray(input_ids, dtype=np.int64),
        loss_mask_T=np.asarray(loss_mask, dtype=np.uint8),
        truncated=truncated,
    )


def _tokenize(chat: ChatTokenizer, parsed: Any, bounds: RecordBounds,
              length_policy: str) -> tuple[list[int], list[int], bool]:
    """Ids, mask and whether the text was cut by characters: a rendered text over `bounds.max_chars` is rejected
    (policy reject) or cut to it before tokenising (truncate), where the mask method can take a cut text."""
    text = chat.text_of(parsed)
    if len(text) <= bounds.max_chars:
        return *chat.encode(parsed, text), False
    if length_policy == "reject":
        raise RecordError("too_long", f"{len(text):,} characters rendered, more than max_length {bounds.max_length} "
                                      f"tokens can hold ({bounds.why()})")
    if chat.can_cut(parsed):
        input_ids, loss_mask = chat.encode(parsed, text[:bounds.max_chars], cut=True)
        if len(input_ids) > bounds.max_length:  # as the bound promises; else the whole text decides
            return input_ids, loss_mask, True
    return *chat.encode(parsed, text), False  # within the record bound: its size in memory is bounded too


def _apply_length_policy(
    input_ids: list[int], loss_mask: list[int], max_length: int, length_policy: str, cut: bool = False
) -> tuple[list[int], list[int], bool]:
    num_tokens, num_loss = len(input_ids), sum(loss_mask)
    if num_tokens > max_length and length_policy == "reject":
        raise RecordError("too_long", f"{num_tokens} tokens > max_length {max_length}")
    truncated = num_tokens > max_length
    input_ids, loss_mask = input_ids[:max_length], loss_mask[:max_length]
    if not any(loss_mask):
        of = f"{num_tokens}+" if cut else f"{num_tokens}"
        where = f"in the first {max_length} of {of} tokens" if truncated else f"in {num_tokens} tokens"
        loss = f"{num_loss}+" if cut else f"{num_loss}"
        raise RecordError("no_loss_tokens", f"none of the {loss} loss tokens lies {where}")
    return input_ids, loss_mask, truncated


def write_rejects(path: Path, rejects: Sequence[Reject]) -> None:
    """Rejects as a Parquet table, written to a temp file and renamed so that readers never see half a file."""
    columns = {name: [getattr(reject, name) for reject in rejects] for name in REJECTS_SCHEMA.names}
    with atomic_path(Path(path)) as tmp:
        pq.write_table(pa.table(columns, schema=REJECTS_SCHEMA), tmp)


def read_rejects(path: Path) -> list[Reject]:
    """The rejects written by `write_rejects`; none when the file does not exist."""
    if not Path(path).is_file():
        return []
    return [Reject(**row) for row in pq.read_table(path).to_pylist()]