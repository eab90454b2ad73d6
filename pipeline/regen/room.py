"""What a regeneration may write, known from its prompts before any engine starts, against the free space of out_dir.

The answers are not known before they are generated, but their size is bounded: each regenerated turn stores its
prompt's and its answer's token ids and their text, and the stage never lets a turn's prompt and answer together pass
data.max_length tokens. The turns are the record's assistant turns (one more when it ends on a question). So
`turns x (data.max_length x BYTES_PER_TOKEN + TURN_EXTRA)` bounds what the parts take, which is what is checked: a
regeneration that may not fit is refused (exit 2) unless `check_space=false`. The bound is loose where answers stop
early: SmolLM2 on 24 bundled conversations (max_tokens 256) wrote 5.4 bytes per prompt and generated token.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from pipeline.config import ConfigError
from pipeline.data import regeneration as rd
from pipeline.regen.conversation import Conversation
from pipeline.shards.capacity import free_bytes, gib

# Uncompressed as a part stores a token: its id (int64) in the prompt's or the answer's ids, and its text (the prompt's
# messages as JSON, the answer decoded), a few bytes a token. Parquet compresses below it (5.4 measured: above).
BYTES_PER_TOKEN = 8 + 8
TURN_EXTRA = 512  # the turn's sampling values (JSON), seed, finish reason, its conversation's ids and end
PART_EXTRA = 64 << 10  # a part's Parquet footer, its marker and rejects, its manifest entry


def turns_of(conversation: Conversation) -> int:
    """The turns a conversation can ask the target for: its record's assistant turns, and one more after a last
    message that is not an answer."""
    roles = [m.get("role") for m in conversation.messages]
    return roles.count("assistant") + (1 if roles and roles[-1] != "assistant" else 0)


def bound_bytes(units: Sequence[Sequence[Conversation]], max_length: int) -> int:
    """The most `units` (each a part) can take on disk."""
    turns = sum(turns_of(c) for unit in units for c in unit)
    return turns * (max_length * BYTES_PER_TOKEN + TURN_EXTRA) + len(units) * PART_EXTRA


def check_room(out: Path, units: Sequence[Sequence[Conversation]], *, max_length: int, overwrite: bool) -> str:
    """The line that says what the parts left to write take at most and what out_dir's file system has free;
    ConfigError with both figures when they may not fit. A resumed regeneration counts only the parts without their
    marker; a replacement (overwrite) frees what the directory holds first."""
    left = [u for i, u in enumerate(units) if overwrite or not rd.part_paths(out, i)["marker"].is_file()]
    need, free = bound_bytes(left, max_length), free_bytes(out, freed=out / rd.RECORDS_DIR if overwrite else None)
    line = (f"regeneration: {len(left)} of {len(units)} part(s) left to write, at most {gib(need)} (each turn's "
            f"prompt and answer at data.max_length={max_length} tokens); out_dir's file system has "
            f"{'an unknown amount' if free is None else gib(free)} free")
    if free is not None and need > free:
        raise ConfigError(f"{line}: it may not fit. Shrink it (a smaller data.max_length or data.limit, fewer "
                          "sampling.n), free space, or pass check_space=false")
    return line
