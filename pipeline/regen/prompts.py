"""The records of a prompt file as conversations to regenerate: each parsed (answers optional), bounded, and made
into `sampling.n` conversations with stable ids and seeds; what cannot be regenerated is a reject with a reason."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.core.contracts import Reject
from pipeline.data.reading import read_each, source_of
from pipeline.data.records import RawRecord
from pipeline.data.regeneration import conversation_id
from pipeline.data.sources import RecordError, parse_record
from pipeline.regen.conversation import Conversation
from pipeline.regen.sampling import conversation_seed


@dataclass
class Prompts:
    source: str
    source_digest: str
    conversations: list[Conversation] = field(default_factory=list)
    rejects: list[Reject] = field(default_factory=list)
    num_records: int = 0


def read_prompts(path: str | Path, tokenizer: Any, *, max_length: int, limit: int | None, n: int,
                 seed: int) -> Prompts:
    """Every record of `path` in file order; `limit` counts records accepted."""
    source = source_of(path, tokenizer, max_length)
    prompts = Prompts(source=source.name, source_digest=source.digest)
    for kept in read_each(source, _parsed, limit=limit):
        if isinstance(kept, Reject):
            prompts.rejects.append(kept)
            continue
        record_id, row, parsed = kept
        prompts.num_records += 1
        for sample in range(n):
            cid = conversation_id(record_id, sample)
            prompts.conversations.append(Conversation(
                conversation_id=cid, record_id=record_id, source=prompts.source, row=row, sample=sample,
                messages=tuple(parsed.messages), tools=parsed.tools, seed=conversation_seed(seed, cid)))
    return prompts


def _parsed(record: RawRecord, record_id: str) -> tuple[str, int, Any]:
    """A record with messages to answer (its answers optional); RecordError otherwise."""
    parsed = parse_record(record.value, require_answer=False)
    if parsed.messages is None:
        raise RecordError("not_a_conversation", "a raw text record has no turns to answer; regeneration needs "
                                                "messages, conversations or a prompt")
    return record_id, record.row, parsed
