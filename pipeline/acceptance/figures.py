"""The acceptance figures, computed from raw spec-decode counters only (cumulative counters read before and after a
prompt), so that a reader of report.json can recompute every figure from the counters saved beside it."""
from __future__ import annotations

from typing import Any, Sequence


def delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """One prompt's counts: the difference of two cumulative reads."""
    return {"drafts": after["drafts"] - before["drafts"], "draft_tokens": after["draft_tokens"] - before["draft_tokens"],
            "accepted": after["accepted"] - before["accepted"],
            "accepted_per_pos": [a - b for a, b in zip(after["accepted_per_pos"], before["accepted_per_pos"])]}


def total(counts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    k = len(counts[0]["accepted_per_pos"]) if counts else 0
    return {"drafts": sum(c["drafts"] for c in counts), "draft_tokens": sum(c["draft_tokens"] for c in counts),
            "accepted": sum(c["accepted"] for c in counts),
            "accepted_per_pos": [sum(c["accepted_per_pos"][i] for c in counts) for i in range(k)]}


def figures(counts: dict[str, Any]) -> dict[str, Any]:
    """acceptance length = 1 + accepted / drafts (tokens per target step); per position i: accepted at i / drafts;
    draft-token rate: accepted / draft tokens. None where nothing was drafted (a prompt ended before a draft step)."""
    drafts, tokens = counts["drafts"], counts["draft_tokens"]
    return {"acceptance_length": 1 + counts["accepted"] / drafts if drafts else None,
            "per_position": [a / drafts for a in counts["accepted_per_pos"]] if drafts else None,
            "draft_token_rate": counts["accepted"] / tokens if tokens else None}


def rate(tokens: int, seconds: float) -> float | None:
    return tokens / seconds if seconds > 0 else None
