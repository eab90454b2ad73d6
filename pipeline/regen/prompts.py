"""The records of a prompt file as conversations to regenerate: each parsed (answers optional), bounded, and made
into `sampling.n` conversations with stable ids and seeds; what cannot be regenerated is a reject with a reason."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.core.contracts import Reject
from pipeline.data.bounds import RecordBounds
from pipeline.data.ids import sample_id_for
from pipeline.data.records import iter_records
from pipeline.data.regeneration import conversation_id
from pipeline.data.sources import RecordError, check_readable, file_digest, parse_record
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
    path = Path(path)
    check_readable(path)
    bounds = RecordBounds.of(tokenizer, max_length)
    prompts = Prompts(source=path.name, source_digest=file_digest(path))
    for record in iter_records(path, max_record_bytes=bounds.max_record_bytes):
        if limit is not None and prompts.num_records >= limit:
            break
        record_id = sample_id_for(prompts.source_digest, record.row)
        try:
            if record.error is not None:
                raise RecordError(record.reason, record.error)
            parsed = parse_record(record.value, require_answer=False)
            if parsed.messages is None:
                raise RecordError("not_a_conversation", "a raw text record has no turns to answer; regeneration "
                                                        "needs messages, conversations or a prompt")
        except RecordError as e:
            prompts.rejects.append(Reject(source=prompts.source, row=record.row, reason=e.reason, detail=e.detail,
                                          sample_id=record_id))
            continue
        prompts.num_records += 1
        for sample in range(n):
            cid = conversation_id(record_id, sample)
            prompts.conversations.append(Conversation(
                conversation_id=cid, record_id=record_id, source=prompts.source, row=record.row, sample=sample,
                messages=tuple(parsed.messages), tools=parsed.tools, seed=conversation_seed(seed, cid)))
    return prompts
