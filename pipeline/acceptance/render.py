"""report.md: the drafts side by side, one column each, the doctor's verdict beside the figures."""
from __future__ import annotations

from typing import Any


def _f(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(report: dict[str, Any]) -> str:
    drafts = report["drafts"]
    s = report["settings"]
    head = "| | " + " | ".join(f"`{d['name']}`" for d in drafts) + " |"
    rows = [head, "|---|" + "---|" * len(drafts)]

    def row(label: str, cells: list[str]) -> None:
        rows.append(f"| {label} | " + " | ".join(cells) + " |")

    row("doctor", [d["doctor"]["verdict"] for d in drafts])
    row("acceptance length", [_f(d["overall"]["acceptance_length"]) for d in drafts])
    for i in range(s["num_speculative_tokens"]):
        row(f"accepted at position {i + 1}",
            [_f((d["overall"]["per_position"] or [None] * (i + 1))[i]) for d in drafts])
    row("draft-token acceptance", [_f(d["overall"]["draft_token_rate"]) for d in drafts])
    row("tokens/s speculative", [_f(d["tokens_per_s"], 1) for d in drafts])
    row("tokens/s plain", [_f(report["plain"]["tokens_per_s"], 1)] * len(drafts))
    row("outputs differing from plain greedy", [f"{d['differing']} of {len(d['prompts'])}" for d in drafts])
    p = report["provenance"]
    return "\n".join([
        f"# Acceptance: {len(drafts)} draft(s) on {p['target']['path']}", "",
        f"vLLM {p['vllm_version']}, {s['dtype']}, K={s['num_speculative_tokens']}, max_tokens={s['max_tokens']}, "
        f"temperature={s['temperature']}, {report['num_prompts']} prompts ({p['prompts']['path']}); figures from vLLM's "
        "own spec-decode counters (report.json keeps them per prompt).", "", *rows, ""])
