"""What each generation request asks for: the configured sampling (`sampling.*`), a seed per conversation and turn,
and the ids that end a turn.

Seeds derive from `sampling.seed` and the conversation's stable id, never from the order requests reach an engine, so
a resumed or re-batched regeneration asks every turn for the same seed.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Mapping

from pipeline.core.contracts import Sampling
from pipeline.core.jsonfile import read_fields
from pipeline.data.mask import TurnIds


def conversation_seed(base: int, conversation_id: str) -> int:
    return int(hashlib.sha256(f"{base}:{conversation_id}".encode()).hexdigest()[:8], 16) & 0x7FFFFFFF


def turn_seed(conversation: int, turn: int) -> int:
    return (conversation + turn) & 0x7FFFFFFF


def stop_token_ids(model_dir: Path, tokenizer: Any, turn_ids: TurnIds | None,
                   configured: list[int] | None) -> tuple[tuple[int, ...], dict[str, Any]]:
    """The ids that end a turn and where each came from: `sampling.stop_token_ids` when set, else the checkpoint's
    generation_config.json eos ids, the tokenizer's eos and (Kimi's layout) the template's `<|im_end|>`."""
    if configured:
        ids = tuple(sorted(set(int(i) for i in configured)))
        vocab = len(tokenizer)
        if outside := [i for i in ids if i >= vocab]:
            raise ValueError(f"sampling.stop_token_ids={list(configured)}: {outside[0]} is outside the tokenizer's "
                             f"{vocab} ids, so no turn could stop on it")
        return ids, {"ids": list(ids), "from": "sampling.stop_token_ids"}
    found: dict[int, list[str]] = {}
    for i in _generation_eos(Path(model_dir)):
        found.setdefault(i, []).append("generation_config.json eos_token_id")
    if getattr(tokenizer, "eos_token_id", None) is not None:
        found.setdefault(int(tokenizer.eos_token_id), []).append("tokenizer eos_token")
    if turn_ids is not None:
        found.setdefault(turn_ids.end, []).append("chat template end of turn <|im_end|>")
    if not found:
        raise ValueError(f"model.path={str(model_dir)!r}: no end-of-turn id found (no eos in generation_config.json "
                         f"or the tokenizer): set sampling.stop_token_ids")
    ids = tuple(sorted(found))
    return ids, {"ids": list(ids), "from": {str(k): v for k, v in sorted(found.items())}}


def _generation_eos(model_dir: Path) -> list[int]:
    """generation_config.json's eos ids, read bounded and typed: ValueError naming the file and the field."""
    path = model_dir / "generation_config.json"
    if not path.is_file():
        return []
    fields = read_fields(path, ValueError, prefix=f"model.path={str(model_dir)!r}: ")
    if not isinstance(fields.value.get("eos_token_id"), list):
        eos = fields.int("eos_token_id", optional=True, minimum=0)
        return [] if eos is None else [eos]
    ids = fields.list("eos_token_id", "int")
    if any(i < 0 for i in ids):
        raise fields.fail("eos_token_id", f"must hold token ids >= 0, got {ids}")
    return ids


def request_sampling(values: Mapping[str, Any], *, seed: int, max_tokens: int,
                     stop_ids: tuple[int, ...]) -> Sampling:
    """One request's sampling: the configured values (`sampling.*`), this turn's seed and token budget."""
    return Sampling(temperature=float(values["temperature"]), top_p=float(values["top_p"]), top_k=int(values["top_k"]),
                    max_tokens=max_tokens, seed=seed, stop_token_ids=stop_ids)
