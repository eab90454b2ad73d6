"""An acceptance report as frozen objects: built once from the engine's counters (figures.py), serialised once
(`Report.to_json`, report.json: field order is the file's key order) and rendered from the objects (render.py).

The counters and counts stay the engine's own mappings (`drafts`, `draft_tokens`, `accepted`, `accepted_per_pos`),
so a reader of report.json can recompute every figure from what is saved beside it."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from pipeline.acceptance import figures as fg


@dataclass(frozen=True, kw_only=True)
class Settings:
    num_speculative_tokens: int
    max_tokens: int
    temperature: float
    dtype: str
    seed: int = 0
    engine_options: dict[str, Any] = field(default_factory=dict)  # --engine-option: the measuring engine's options


@dataclass(frozen=True, kw_only=True)
class Doctor:
    verdict: str  # OK | MISMATCH
    findings: tuple[str, ...]  # "STATUS check message", one per check


def _figures(counts: dict[str, Any]) -> dict[str, Any]:
    """acceptance_length = 1 + accepted / drafts; per_position i: accepted at i / drafts; draft_token_rate: accepted
    / draft tokens; None where nothing was drafted (figures.py)."""
    found = fg.figures(counts)
    return {**found, "per_position": None if found["per_position"] is None else tuple(found["per_position"])}


@dataclass(frozen=True, kw_only=True)
class PromptResult:
    prompt: int
    counters_before: dict[str, Any]  # the engine's cumulative counters before this prompt
    counters_after: dict[str, Any]
    counts: dict[str, Any]  # their difference
    acceptance_length: float | None  # the figures of `counts` (`_figures`)
    per_position: tuple[float, ...] | None
    draft_token_rate: float | None
    output_tokens: int
    seconds: float
    equals_plain: bool
    output_ids: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class Overall:
    counts: dict[str, Any]  # the prompts' counts summed
    acceptance_length: float | None  # the figures of `counts` (`_figures`)
    per_position: tuple[float, ...] | None
    draft_token_rate: float | None


@dataclass(frozen=True, kw_only=True)
class DraftResult:
    name: str
    doctor: Doctor
    overall: Overall
    tokens_per_s: float | None
    differing: int  # outputs that differ from the plain greedy ones
    differing_share: float
    prompts: tuple[PromptResult, ...]
    speculative_config: dict[str, Any]  # what vLLM was given


@dataclass(frozen=True, kw_only=True)
class NotMeasured:
    """A draft vLLM refused or failed on: no figures, the error in one line."""

    name: str
    path: str
    exit_code: int
    error: str
    doctor: Doctor


@dataclass(frozen=True, kw_only=True)
class PlainOutput:
    output_ids: tuple[int, ...]
    seconds: float


@dataclass(frozen=True, kw_only=True)
class Plain:
    tokens_per_s: float | None
    prompts: tuple[PlainOutput, ...]


@dataclass(frozen=True, kw_only=True)
class TargetSource:
    path: str
    config_sha256: str
    run: str | None
    export: str | None


@dataclass(frozen=True, kw_only=True)
class PromptSource:
    path: str
    sha256: str
    prompt_ids: tuple[tuple[int, ...], ...]


@dataclass(frozen=True, kw_only=True)
class DraftFiles:
    path: str
    files: dict[str, str]  # name -> sha256


@dataclass(frozen=True, kw_only=True)
class Provenance:
    vllm_version: str
    target: TargetSource
    prompts: PromptSource
    drafts: tuple[DraftFiles, ...]
    environment: dict[str, Any]  # the engine's own account of how it ran


@dataclass(frozen=True, kw_only=True)
class Report:
    settings: Settings
    num_prompts: int
    rejected_records: int
    plain: Plain
    drafts: tuple[DraftResult, ...]
    failed: tuple[NotMeasured, ...]
    provenance: Provenance

    def to_json(self) -> str:
        """report.json's text (keys in field order)."""
        return json.dumps(asdict(self), indent=1) + "\n"


def prompt_result(index: int, served: dict[str, Any], plain_ids: list[int]) -> PromptResult:
    """One prompt's result from the engine's cumulative counters read before and after it."""
    counts = fg.delta(served["before"], served["after"])
    return PromptResult(prompt=index, counters_before=served["before"], counters_after=served["after"], counts=counts,
                        **_figures(counts), output_tokens=len(served["output_ids"]), seconds=served["seconds"],
                        equals_plain=served["output_ids"] == plain_ids, output_ids=tuple(served["output_ids"]))


def draft_result(name: str, served: dict[str, Any], plain: Plain, doctor: Doctor) -> DraftResult:
    rows = tuple(prompt_result(i, r, list(p.output_ids)) for i, (r, p) in enumerate(zip(served["results"],
                                                                                         plain.prompts)))
    tokens, seconds = sum(r.output_tokens for r in rows), sum(r.seconds for r in rows)
    overall = fg.total([r.counts for r in rows])
    differing = sum(not r.equals_plain for r in rows)
    return DraftResult(name=name, doctor=doctor, overall=Overall(counts=overall, **_figures(overall)),
                       tokens_per_s=fg.rate(tokens, seconds), differing=differing,
                       differing_share=differing / len(rows),
                       prompts=rows, speculative_config=served["info"]["extra"]["speculative_config"])


def plain_result(results: list[dict[str, Any]]) -> Plain:
    return Plain(tokens_per_s=fg.rate(sum(len(r["output_ids"]) for r in results), sum(r["seconds"] for r in results)),
                 prompts=tuple(PlainOutput(output_ids=tuple(r["output_ids"]), seconds=r["seconds"]) for r in results))
