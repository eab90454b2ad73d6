"""The doctor's findings: one line per check (`STATUS check sentence`), a summary last, or one JSON document."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Sequence

STATUSES = ("OK", "WARN", "MISMATCH", "ERROR")


@dataclass(frozen=True)
class Finding:
    status: str  # one of STATUSES
    check: str
    message: str

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"finding status {self.status!r} is not one of {STATUSES}")


def counts(findings: Sequence[Finding]) -> dict[str, int]:
    return {s: sum(f.status == s for f in findings) for s in STATUSES}


def failed(findings: Sequence[Finding]) -> bool:
    return any(f.status in ("MISMATCH", "ERROR") for f in findings)


def summary_line(findings: Sequence[Finding]) -> str:
    c = counts(findings)
    verdict = ("this server will not feed this drafter what it was trained on: fix every MISMATCH and ERROR above"
               if failed(findings) else "nothing found that would feed this drafter other features than its training")
    return (f"SUMMARY {len(findings)} checks: {c['OK']} OK, {c['WARN']} WARN, {c['MISMATCH']} MISMATCH, "
            f"{c['ERROR']} ERROR; {verdict}")


def render_text(findings: Sequence[Finding]) -> str:
    width = max(len(s) for s in STATUSES)
    lines = [f"{f.status:<{width}} {f.check} {f.message}" for f in findings]
    return "\n".join([*lines, summary_line(findings)])


def render_json(findings: Sequence[Finding], context: dict) -> str:
    return json.dumps({"checks": [asdict(f) for f in findings], "counts": counts(findings),
                       "ok": not failed(findings), "summary": summary_line(findings), **context}, indent=2)
