"""The tables every report form shows (markdown, HTML, terminal): rows per engine and per point, the verdict."""
from __future__ import annotations

from pathlib import Path

from rich.table import Table

from pipeline.compare.analyze import DiffResult, PairResult
from pipeline.compare.kinds import Check, PairKind, Status

KIND_TITLE = {PairKind.REFERENCE: "against the reference", PairKind.PAIR: "engine pairs (reported, not judged)",
              PairKind.DETERMINISM: "run-to-run determinism (same batch twice)",
              PairKind.BATCH: "batch composition (alone vs in a batch)"}


def fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return "0" if x == 0 else f"{x:.2e}"


def point_rows(pair: PairResult) -> list[list[str]]:
    rows = []
    for label in pair.labels:
        s = pair.points[label]
        rows.append([label, pair.verdict.point_status.get(label, ""), fmt(s.rel_l2), fmt(s.p50), fmt(s.p90),
                     fmt(s.max), f"{s.cosine:.6f}", fmt(s.max_abs), fmt(s.pos0), fmt(s.later),
                     f"{s.flip_fraction:.1%}", "yes" if s.identical else "no"])
    return rows


POINT_HEADER = ["point", "status", "rel L2", "p50 tok", "p90 tok", "max tok", "cosine", "max abs", "pos 0",
                "pos ≥1", "tokens > flip level", "bit-identical"]


def engine_rows(result: DiffResult) -> list[list[str]]:
    rows = []
    for r in result.runs:
        info = r.info or {}
        q = info.get("quantization") or {}
        rows.append([r.label, r.role, f"{info.get('framework', '?')} {info.get('framework_version', '')}".strip(),
                     str(info.get("dtype", r.config.get("dtype"))), str(q.get("method")),
                     str(info.get("attention_backend", "?")), ", ".join(r.labels) if len(r.labels) < 8 else
                     f"{r.labels[0]} .. {r.labels[-1]} ({len(r.labels)})",
                     f"{r.seconds.get('total', 0):.1f}s", r.error or "ok"])
    return rows


def storage_rows(result: DiffResult) -> list[list[str]]:
    """Per compared engine and point: the storage's rounding error beside the engine's divergence from the
    reference (rel L2 both), and their ratio."""
    storage = result.storage or {}
    divergence = {p.b: p.points for p in result.pairs if p.kind == PairKind.REFERENCE}
    rows = []
    for engine, figures in storage.get("rel_l2", {}).items():
        for label, rounding in figures.items():
            stats = divergence.get(engine, {}).get(label)
            ratio = f"{rounding / stats.rel_l2:.2f}" if stats is not None and stats.rel_l2 > 0 else "-"
            rows.append([engine, label, fmt(rounding), fmt(stats.rel_l2 if stats else None), ratio])
    return rows


def storage_title(result: DiffResult) -> str:
    s = result.storage or {}
    return (f"Storage rounding: runner.storage_dtype={s.get('dtype')} ({s.get('scaling')} scaling) against "
            f"{result.reference}")


STORAGE_HEADER = ["engine", "point", "storage rel L2", "divergence from the reference (rel L2)",
                  "storage / divergence"]
ENGINE_HEADER = ["engine", "role", "framework", "dtype", "quantization", "attention", "points", "time", "state"]


def verdict_table(result: DiffResult, report_dir: Path | None = None):
    """The short terminal verdict (a rich renderable)."""
    style = {Status.PASS: "green", Status.WARN: "yellow", Status.FAIL: "bold red"}
    table = Table(title=f"diff verdict: [{style[result.status]}]{result.status.upper()}[/]"
                        + (f"  (report: {report_dir})" if report_dir else ""), title_justify="left")
    for col in ("comparison", "dtype", "status", "first divergent", "worst rel L2", "top-1", "KL", "note"):
        table.add_column(col, overflow="fold")
    for p in result.pairs:
        if p.kind == PairKind.PAIR:
            continue
        worst = max((s.rel_l2 for s in p.points.values()), default=0.0)
        note = "routing flips" if p.verdict.routing_flips else (p.verdict.locus or "")
        table.add_row(p.name, p.verdict.dtype, f"[{style[p.verdict.status]}]{p.verdict.status}[/]",
                      p.verdict.onset or "-", fmt(worst), f"{p.logits.top1:.1%}" if p.logits else "-",
                      fmt(p.logits.kl_mean) if p.logits else "-", note[:80])
    for al in result.alignments:
        table.add_row(f"alignment {al.engine}", "", f"[{style[Status.PASS if al.status == Check.OK else al.status]}]"
                      f"{al.status}[/]", "", "", "", "", "; ".join(al.problems)[:160] or "every point is where claimed")
    for an in result.anchors:
        if an.status != Check.OK:
            table.add_row(f"anchor {an.engine} {an.check}", "", f"[{style[Status.FAIL]}]fail[/]", "", fmt(an.rel_l2),
                          "", "", an.detail[:120])
    for r in result.runs:
        if r.error:
            table.add_row(f"engine {r.label}", "", f"[{style[Status.FAIL]}]error[/]", "", "", "", "", r.error[:160])
    return table
