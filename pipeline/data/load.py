"""The data a job reads, from either kind of `data.path`: a prompt file (its recorded answers, tokenised through the
chat template: pipeline.data.prepare) or a regeneration directory (the target's own answers, their ids as generated:
pipeline.data.regeneration). Extract and the diff read their samples through here, so both take either."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.data.mask import MaskOptions
from pipeline.data.prepare import PreparedData, prepare
from pipeline.data.regeneration import answers_of, is_regeneration, read_regenerated


def load_samples(path: str | Path, tokenizer: Any, data: Any, *, limit: int | None, vocab_size: int | None = None,
                 error: type[Exception] = ValueError) -> PreparedData:
    """`data`: the job's data config (max_length, length_policy, train_think_tags, ...); `limit`: samples kept;
    `vocab_size`: the target's, which every generated id of a regeneration must be below."""
    if is_regeneration(Path(path)):
        return answers_of(read_regenerated(Path(path), tokenizer, max_length=data.max_length,
                                           length_policy=data.length_policy, limit=limit, vocab_size=vocab_size,
                                           train_think_tags=data.train_think_tags, error=error))
    return prepare(path, tokenizer, max_length=data.max_length, length_policy=data.length_policy, limit=limit,
                   mask=MaskOptions.of(data))
