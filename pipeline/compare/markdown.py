"""report.md: the report for people, as text."""
from __future__ import annotations

from pipeline.compare.analyze import DiffResult
from pipeline.compare.tables import (
    ENGINE_HEADER,
    KIND_TITLE,
    POINT_HEADER,
    STORAGE_HEADER,
    engine_rows,
    fmt,
    point_rows,
    storage_rows,
    storage_title,
)


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return out + ["| " + " | ".join(r) + " |" for r in rows]


def to_markdown(result: DiffResult) -> str:
    out = [f"# Cross-framework diff: {result.status.upper()}", ""]
    out += [f"Reference: **{result.reference}**; model `{result.model.get('path')}` "
            f"({result.model.get('model_type')}, {result.model.get('num_layers')} layers, MoE layers "
            f"{result.model.get('moe_layers') or 'none'}); probe: {result.probe.get('num_samples')} samples, "
            f"{result.probe.get('num_tokens')} tokens.", ""]
    if result.probe.get("answers_by"):
        out += [f"Answers by {result.probe['answers_by']}; features by the engines below.", ""]
    for title, items in (("Failures", result.failures), ("Warnings", result.warnings)):
        if items:
            out += [f"## {title}", ""] + [f"- {x}" for x in items] + [""]
    out += ["## Engines", ""] + _md_table(ENGINE_HEADER, engine_rows(result)) + [""]
    if result.storage:
        out += [f"## {storage_title(result)}", ""] + _md_table(STORAGE_HEADER, storage_rows(result)) + [""]
    for al in result.alignments:
        out += [f"## Alignment: {al.engine} against {al.reference} ({al.status})", ""]
        out += _md_table(["claimed", "matched", "distance", "to claimed", "runner-up", "votes", "status"],
                         [[m.claimed, m.matched, fmt(m.distance), fmt(m.claimed_distance),
                           f"{m.runner_up} {fmt(m.runner_up_distance)}", f"{m.votes:.0%}", m.status]
                          for m in al.matches]) + [""]
        out += [f"- {p}" for p in al.problems] + [f"- note: {n}" for n in al.notes]
        out += [""] if al.problems or al.notes else []
    if result.anchors:
        out += ["## Checkpoint anchors", ""]
        out += _md_table(["engine", "check", "rel L2", "status", "detail"],
                         [[a.engine, a.check, fmt(a.rel_l2), a.status, a.detail] for a in result.anchors]) + [""]
    for kind, title in KIND_TITLE.items():
        pairs = [p for p in result.pairs if p.kind == kind]
        if pairs:
            out += [f"## Comparisons {title}", ""]
        for p in pairs:
            out += [f"### {p.name}: {p.verdict.status} ({p.verdict.dtype} tolerances)", ""]
            if p.verdict.headline:
                out += [p.verdict.headline, ""]
            out += _md_table(POINT_HEADER, point_rows(p)) + [""]
            if p.logits:
                lg = p.logits
                out += [f"Logits ({lg.source_a} / {lg.source_b}, checkpoint LM head, float32): top-1 agreement "
                        f"{lg.top1:.2%}, KL mean {lg.kl_mean:.2e}, p99 {lg.kl_p99:.2e}, max {lg.kl_max:.2e} "
                        f"over {lg.num_tokens} tokens.", ""]
    return "\n".join(out) + "\n"
