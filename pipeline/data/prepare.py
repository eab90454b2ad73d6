"""Data preparation: records -> token ids + assistant loss mask, with a length policy and a reason for every reject.

Token ids come from the target's own chat template, rendered exactly as `apply_chat_template` renders it, so the
ids captured here are the ids a serving engine would see for the same conversation.
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import jinja2
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from transformers.utils.chat_template_utils import render_jinja_template

from pipeline.core.contracts import PreparedSample, Reject
from pipeline.core.io import atomic_path
from pipeline.data.sources import (
    Parsed,
    RawRecord,
    RecordError,
    check_readable,
    file_digest,
    iter_records,
    parse_record,
)

LengthPolicy = Literal["truncate", "reject"]
LENGTH_POLICIES = ("truncate", "reject")
SAMPLE_ID_HEX_CHARS = 16
_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
REJECTS_SCHEMA = pa.schema(
    [
        ("source", pa.string()),
        ("row", pa.int64()),
        ("sample_id", pa.string()),
        ("reason", pa.string()),
        ("detail", pa.string()),
    ]
)


@dataclass
class PreparedData:
    """What one data file became: samples in file order, rejects in file order, and the file's sha256."""

    source: str
    source_digest: str
    samples: list[PreparedSample] = field(default_factory=list)
    rejects: list[Reject] = field(default_factory=list)


def sample_id_for(source_digest: str, row: int) -> str:
    """Depends on the file's bytes and the row only, so a copy of the file anywhere gives the same ids."""
    return hashlib.sha256(f"{source_digest}:{row}".encode()).hexdigest()[:SAMPLE_ID_HEX_CHARS]


def prepare(
    path: str | Path,
    tokenizer: Any,
    *,
    max_length: int,
    length_policy: LengthPolicy,
    limit: int | None = None,
) -> PreparedData:
    """Tokenize every record of `path`; stop once `limit` samples are accepted (rejects do not count)."""
    _check_options(max_length, length_policy, limit)
    path = Path(path)
    check_readable(path)
    data = PreparedData(source=path.name, source_digest=file_digest(path))
    for record in iter_records(path):
        if limit is not None and len(data.samples) >= limit:
            break
        result = _prepare_record(record, data, tokenizer, max_length, length_policy)
        (data.samples if isinstance(result, PreparedSample) else data.rejects).append(result)
    return data


def _check_options(max_length: int, length_policy: str, limit: int | None) -> None:
    if not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"max_length must be a positive integer, got {max_length!r}")
    if length_policy not in LENGTH_POLICIES:
        raise ValueError(f"length_policy must be one of {LENGTH_POLICIES}, got {length_policy!r}")
    if limit is not None and (not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be None or a non-negative integer, got {limit!r}")


def _prepare_record(
    record: RawRecord, data: PreparedData, tokenizer: Any, max_length: int, length_policy: str
) -> PreparedSample | Reject:
    sample_id = sample_id_for(data.source_digest, record.row)
    try:
        if record.error is not None:
            raise RecordError("malformed_json", record.error)
        input_ids, loss_mask = tokenize(parse_record(record.value), tokenizer)
        input_ids, loss_mask, truncated = _apply_length_policy(input_ids, loss_mask, max_length, length_policy)
    except RecordError as e:
        return Reject(source=data.source, row=record.row, reason=e.reason, detail=e.detail, sample_id=sample_id)
    return PreparedSample(
        sample_id=sample_id,
        source=data.source,
        row=record.row,
        input_ids_T=np.asarray(input_ids, dtype=np.int64),
        loss_mask_T=np.asarray(loss_mask, dtype=np.uint8),
        truncated=truncated,
    )


def _apply_length_policy(
    input_ids: list[int], loss_mask: list[int], max_length: int, length_policy: str
) -> tuple[list[int], list[int], bool]:
    num_tokens, num_loss = len(input_ids), sum(loss_mask)
    if num_tokens > max_length and length_policy == "reject":
        raise RecordError("too_long", f"{num_tokens} tokens > max_length {max_length}")
    truncated = num_tokens > max_length
    input_ids, loss_mask = input_ids[:max_length], loss_mask[:max_length]
    if not any(loss_mask):
        where = f"in the first {max_length} of {num_tokens} tokens" if truncated else f"in {num_tokens} tokens"
        raise RecordError("no_loss_tokens", f"none of the {num_loss} loss tokens lies {where}")
    return input_ids, loss_mask, truncated


def tokenize(parsed: Parsed, tokenizer: Any) -> tuple[list[int], list[int]]:
    """Token ids and loss mask (1 = train on this token) for a parsed record."""
    if parsed.text is not None:
        # Raw text trains on everything; special tokens are whatever the tokenizer adds to plain text by default.
        input_ids = list(tokenizer(parsed.text)["input_ids"])
        return input_ids, [1] * len(input_ids)
    try:
        if has_generation_markers(tokenizer.chat_template):
            return mask_from_markers(tokenizer, parsed.messages)
        return mask_incremental(tokenizer, parsed.messages)
    except jinja2.TemplateError as e:
        raise RecordError("template_error", f"the chat template refused the conversation: {e}") from e


def has_generation_markers(chat_template: str | None) -> bool:
    if not chat_template:
        raise ValueError("the tokenizer has no chat template; chat records need one")
    return bool(_GENERATION_TAG.search(chat_template))


def mask_from_markers(tokenizer: Any, messages: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    """The template's {% generation %} spans, mapped to tokens by transformers."""
    out = tokenizer.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    return list(out["input_ids"]), list(out["assistant_masks"])


def mask_incremental(tokenizer: Any, messages: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    """For templates without generation markers (Kimi's own): the tokens each assistant message adds.

    The prefix before message i, rendered with the generation prompt, ends where the assistant's content starts;
    the prefix through message i ends after its end-of-turn token. Both must be token prefixes of the whole
    conversation, else the template rewrites history (e.g. drops earlier reasoning) and this method cannot apply.
    """
    input_ids = _encode_chat(tokenizer, messages, add_generation_prompt=False)
    loss_mask = [0] * len(input_ids)
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = _prefix_length(tokenizer, messages[:index], True, input_ids, index)
        end = _prefix_length(tokenizer, messages[: index + 1], False, input_ids, index)
        loss_mask[start:end] = [1] * (end - start)
    return input_ids, loss_mask


def _prefix_length(
    tokenizer: Any, messages: list[dict[str, str]], add_generation_prompt: bool, full_ids: list[int], index: int
) -> int:
    prefix_ids = _encode_chat(tokenizer, messages, add_generation_prompt=add_generation_prompt)
    if prefix_ids != full_ids[: len(prefix_ids)]:
        raise RecordError(
            "template_not_incremental",
            f"rendering up to message {index} ({len(prefix_ids)} tokens) is not a prefix of the whole conversation "
            f"({len(full_ids)} tokens), so the assistant tokens cannot be located without generation markers",
        )
    return len(prefix_ids)


def _encode_chat(tokenizer: Any, messages: list[dict[str, str]], add_generation_prompt: bool) -> list[int]:
    # render_jinja_template, unlike apply_chat_template, accepts the empty prefix before a leading assistant turn.
    rendered, _ = render_jinja_template(
        conversations=[messages],
        chat_template=tokenizer.get_chat_template(),
        add_generation_prompt=add_generation_prompt,
        **tokenizer.special_tokens_map,
    )
    # The same call apply_chat_template makes: the template already wrote every special token.
    return list(tokenizer(rendered[0], add_special_tokens=False)["input_ids"])


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