"""Writing a DiffResult: report.json (machine), report.md (people), report.html (people, with plots), the compact
summary that goes into the manifest and every shard, and the verdict table printed in the terminal.

report.json holds everything the other files are drawn from: `from_dict` rebuilds the DiffResult, so report.html can
be drawn later, on any machine (`python -m pipeline.compare.html DIR`)."""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from pipeline.compare.align import Alignment, PointMatch
from pipeline.compare.analyze import AnchorCheck, DiffResult, PairResult
from pipeline.compare.judge import LogitStats, Verdict
from pipeline.compare.metrics import PointStats
from pipeline.compare.probe import EngineRun
from pipeline.points import parse_points
from pipeline.shards.layout import write_text_atomic

FORMAT = "pipeline.diff/1"
REPORT_FILES = ("report.json", "report.md", "report.html")
_KIND_TITLE = {"reference": "against the reference", "pair": "engine pairs (reported, not judged)",
               "determinism": "run-to-run determinism (same batch twice)",
               "batch": "batch composition (alone vs in a batch)"}


def _clean(x: Any) -> Any:
    """JSON-safe: non-finite floats become strings ('nan', 'inf')."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def _engine(run: EngineRun) -> dict[str, Any]:
    return {"label": run.label, "role": run.role, "config": run.config, "points": run.labels, "info": run.info,
            "error": run.error, "ran_on": run.ran_on, "seconds": {k: round(v, 3) for k, v in run.seconds.items()}}


def _pair(pair: PairResult) -> dict[str, Any]:
    v = pair.verdict
    return {"kind": pair.kind, "name": pair.name, "a": pair.a, "b": pair.b, "judged": pair.judged,
            "dtype": v.dtype, "status": v.status, "onset": v.onset, "last_within": v.last_within, "locus": v.locus,
            "routing_flips": v.routing_flips, "failures": v.failures, "warnings": v.warnings,
            "headline": v.headline, "point_status": v.point_status, "labels": pair.labels,
            "points": {k: dataclasses.asdict(s) for k, s in pair.points.items()},
            "logits": dataclasses.asdict(pair.logits) if pair.logits else None}


def to_dict(result: DiffResult, *, config: dict[str, Any]) -> dict[str, Any]:
    return _clean({
        "format": FORMAT, "status": result.status, "reference": result.reference,
        "failures": result.failures, "warnings": result.warnings,
        "model": result.model, "probe": result.probe, "config": config,
        "engines": [_engine(r) for r in result.runs],
        "pairs": [_pair(p) for p in result.pairs],
        "alignment": [dataclasses.asdict(a) for a in result.alignments],
        "anchors": [dataclasses.asdict(a) for a in result.anchors],
        "seconds": {k: round(v, 3) for k, v in result.seconds.items()},
    })


def _floats(x: Any) -> Any:
    return [_floats(v) for v in x] if isinstance(x, list) else float(x)


def _revive(cls: type, data: dict[str, Any]) -> Any:
    """A report dataclass from its JSON form: the non-finite floats that `_clean` wrote as strings become floats."""
    kw = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        v = data[f.name]
        if f.type in ("float", "float | None") and isinstance(v, str):
            v = float(v)
        elif f.type in ("list[float]", "list[list[float]]"):
            v = _floats(v)
        kw[f.name] = v
    return cls(**kw)


def _pair_from(d: dict[str, Any]) -> PairResult:
    points = {k: _revive(PointStats, s) for k, s in d["points"].items()}
    verdict = Verdict(status=d["status"], dtype=d["dtype"], onset=d["onset"], last_within=d["last_within"],
                      locus=d["locus"], routing_flips=d["routing_flips"], point_status=d["point_status"],
                      failures=d["failures"], warnings=d["warnings"], headline=d.get("headline", ""))
    return PairResult(kind=d["kind"], a=d["a"], b=d["b"], name=d["name"], labels=d.get("labels", list(points)),
                      points=points, logits=_revive(LogitStats, d["logits"]) if d["logits"] else None,
                      verdict=verdict, judged=d["judged"])


def _alignment_from(d: dict[str, Any]) -> Alignment:
    return _revive(Alignment, {**d, "matches": [_revive(PointMatch, m) for m in d["matches"]]})


def from_dict(data: dict[str, Any]) -> DiffResult:
    """The DiffResult a report.json was written from (everything its report.md and report.html show)."""
    if data.get("format") != FORMAT:
        raise ValueError(f"format {data.get('format')!r} is not a {FORMAT} report")
    num_layers = data["model"]["num_layers"]
    runs = [EngineRun(label=e["label"], role=e["role"], config=e["config"], info=e["info"], error=e["error"],
                      ran_on=e.get("ran_on"), seconds=e["seconds"],
                      points=parse_points(e["points"], num_layers=num_layers))
            for e in data["engines"]]
    return DiffResult(status=data["status"], reference=data["reference"], runs=runs,
                      pairs=[_pair_from(p) for p in data["pairs"]],
                      alignments=[_alignment_from(a) for a in data["alignment"]],
                      anchors=[_revive(AnchorCheck, a) for a in data["anchors"]],
                      failures=data["failures"], warnings=data["warnings"], probe=data["probe"], model=data["model"],
                      thresholds=data["config"].get("thresholds", {}), seconds=data["seconds"])


def load(report_dir: Path) -> DiffResult:
    """The DiffResult of `report_dir/report.json`; a clear error when there is none or it is not a diff report."""
    path = Path(report_dir) / "report.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (a report directory holds report.json: the run's diff/, or "
                                "the out_dir of python -m pipeline.diff)")
    try:
        return from_dict(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a readable {FORMAT} report ({type(e).__name__}: {e})") from e


def _sig(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else float(f"{x:.{digits}g}")


def summary(result: DiffResult, *, report: str) -> dict[str, Any]:
    """The compact record for the manifest and every shard: no timings, 3 significant digits (stable on reruns of
    deterministic engines, so a resumed run keeps its provenance digest)."""
    pairs = {}
    for p in result.pairs:
        if p.kind != "reference":
            continue
        worst = max((s.rel_l2 for s in p.points.values()), default=0.0)
        pairs[p.name] = {"dtype": p.verdict.dtype, "status": p.verdict.status, "first_divergent": p.verdict.onset,
                         "locus": p.verdict.locus, "routing_flips": p.verdict.routing_flips,
                         "worst_rel_l2": _sig(worst),
                         "top1": _sig(p.logits.top1) if p.logits else None,
                         "kl": _sig(p.logits.kl_mean) if p.logits else None}
    checks = {p.name: p.verdict.status for p in result.pairs if p.kind in ("determinism", "batch")}
    return _clean({
        "status": result.status, "reference": result.reference,
        "engines": [r.label for r in result.runs],
        "probe": {"num_samples": result.probe.get("num_samples"), "num_tokens": result.probe.get("num_tokens")},
        "pairs": pairs, "self_checks": checks,
        "alignment": {a.engine: a.status for a in result.alignments},
        "alignment_problems": [p for a in result.alignments for p in a.problems][:8],
        "failures": result.failures[:8], "warnings": result.warnings[:8],
        "report": report,
    })


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return "0" if x == 0 else f"{x:.2e}"


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return out + ["| " + " | ".join(r) + " |" for r in rows]


def point_rows(pair: PairResult) -> list[list[str]]:
    rows = []
    for label in pair.labels:
        s = pair.points[label]
        rows.append([label, pair.verdict.point_status.get(label, ""), _fmt(s.rel_l2), _fmt(s.p50), _fmt(s.p90),
                     _fmt(s.max), f"{s.cosine:.6f}", _fmt(s.max_abs), _fmt(s.pos0), _fmt(s.later),
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


ENGINE_HEADER = ["engine", "role", "framework", "dtype", "quantization", "attention", "points", "time", "state"]


def to_markdown(result: DiffResult) -> str:
    out = [f"# Cross-framework diff: {result.status.upper()}", ""]
    out += [f"Reference: **{result.reference}**; model `{result.model.get('path')}` "
            f"({result.model.get('model_type')}, {result.model.get('num_layers')} layers, MoE layers "
            f"{result.model.get('moe_layers') or 'none'}); probe: {result.probe.get('num_samples')} samples, "
            f"{result.probe.get('num_tokens')} tokens.", ""]
    for title, items in (("Failures", result.failures), ("Warnings", result.warnings)):
        if items:
            out += [f"## {title}", ""] + [f"- {x}" for x in items] + [""]
    out += ["## Engines", ""] + _md_table(ENGINE_HEADER, engine_rows(result)) + [""]
    for al in result.alignments:
        out += [f"## Alignment: {al.engine} against {al.reference} ({al.status})", ""]
        out += _md_table(["claimed", "matched", "distance", "to claimed", "runner-up", "votes", "status"],
                         [[m.claimed, m.matched, _fmt(m.distance), _fmt(m.claimed_distance),
                           f"{m.runner_up} {_fmt(m.runner_up_distance)}", f"{m.votes:.0%}", m.status]
                          for m in al.matches]) + [""]
        out += [f"- {p}" for p in al.problems] + [f"- note: {n}" for n in al.notes]
        out += [""] if al.problems or al.notes else []
    if result.anchors:
        out += ["## Checkpoint anchors", ""]
        out += _md_table(["engine", "check", "rel L2", "status", "detail"],
                         [[a.engine, a.check, _fmt(a.rel_l2), a.status, a.detail] for a in result.anchors]) + [""]
    for kind, title in _KIND_TITLE.items():
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


def write_report(result: DiffResult, out_dir: Path, *, config: dict[str, Any], html: bool) -> Path:
    """report.json, report.md and (html=True) report.html in out_dir; stale files of an earlier report go first."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in REPORT_FILES:
        (out_dir / name).unlink(missing_ok=True)
    data = to_dict(result, config=config)
    write_text_atomic(out_dir / "report.json", json.dumps(data, indent=1, allow_nan=False) + "\n")
    write_text_atomic(out_dir / "report.md", to_markdown(result))
    if html:
        write_html(result, out_dir)
    return out_dir


def write_html(result: DiffResult, out_dir: Path) -> Path:
    from pipeline.compare.html import to_html

    write_text_atomic(out_dir / "report.html", to_html(result))
    return out_dir / "report.html"


def verdict_table(result: DiffResult, report_dir: Path | None = None):
    """The short terminal verdict (a rich renderable)."""
    from rich.table import Table

    style = {"pass": "green", "warn": "yellow", "fail": "bold red"}
    table = Table(title=f"diff verdict: [{style[result.status]}]{result.status.upper()}[/]"
                        + (f"  (report: {report_dir})" if report_dir else ""), title_justify="left")
    for col in ("comparison", "dtype", "status", "first divergent", "worst rel L2", "top-1", "KL", "note"):
        table.add_column(col, overflow="fold")
    for p in result.pairs:
        if p.kind == "pair":
            continue
        worst = max((s.rel_l2 for s in p.points.values()), default=0.0)
        note = "routing flips" if p.verdict.routing_flips else (p.verdict.locus or "")
        table.add_row(p.name, p.verdict.dtype, f"[{style[p.verdict.status]}]{p.verdict.status}[/]",
                      p.verdict.onset or "-", _fmt(worst), f"{p.logits.top1:.1%}" if p.logits else "-",
                      _fmt(p.logits.kl_mean) if p.logits else "-", note[:80])
    for al in result.alignments:
        table.add_row(f"alignment {al.engine}", "", f"[{style['pass' if al.status == 'ok' else al.status]}]"
                      f"{al.status}[/]", "", "", "", "", "; ".join(al.problems)[:160] or "every point is where claimed")
    for an in result.anchors:
        if an.status != "ok":
            table.add_row(f"anchor {an.engine} {an.check}", "", f"[{style['fail']}]fail[/]", "", _fmt(an.rel_l2),
                          "", "", an.detail[:120])
    for r in result.runs:
        if r.error:
            table.add_row(f"engine {r.label}", "", f"[{style['fail']}]error[/]", "", "", "", "", r.error[:160])
    return table
