"""report.html: one self-contained file (PNG plots embedded as base64, inline CSS, no scripts, no external links)."""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Sequence

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from pipeline.compare.align import Alignment
from pipeline.compare.analyze import DiffResult, PairResult
from pipeline.compare.kinds import Check, Match, PairKind, Status
from pipeline.compare.serialize import load
from pipeline.compare.tables import (
    ENGINE_HEADER,
    KIND_TITLE,
    POINT_HEADER,
    STORAGE_HEADER,
    engine_rows,
    point_rows,
    storage_rows,
    storage_title,
)
from pipeline.core import plots
from pipeline.core.cli import ExitCode
from pipeline.core.storage import path_arg
from pipeline.core.io import write_text_atomic
from pipeline.shards.layout import REPORT_HTML

# The page's structure lives in templates/report.html.j2; the plots are drawn here and embedded as <img> tags.
_TEMPLATE = Environment(loader=PackageLoader("pipeline.compare", "templates"), autoescape=True,
                        undefined=StrictUndefined).get_template("report.html.j2")
_FLOOR = 1e-12  # the lowest a log axis goes; zeros are drawn at a floor below the smallest nonzero value
_CSS = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1400px}
table{border-collapse:collapse;margin:8px 0 16px;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}th{background:#f2f2f2}
td:first-child,th:first-child{text-align:left}
.pass,.ok{color:#0a7d27}.warn,.flips,.ambiguous,.unverified{color:#a66f00}
.fail,.over,.misaligned,.missing,.error{color:#c0142b;font-weight:bold}
.downstream{color:#c0142b}
.banner{font-size:22px;font-weight:bold;padding:10px 14px;border-radius:6px;display:inline-block}
.banner.pass{background:#e3f6e8}.banner.warn{background:#fff3d6}.banner.fail{background:#fde2e5}
img{max-width:100%;border:1px solid #eee;margin:6px 0}
li{margin:3px 0}
"""


def floor_of(values: Sequence[float]) -> float:
    positive = [v for v in values if math.isfinite(v) and v > 0]
    return max(_FLOOR, min(positive) / 10) if positive else 1e-3


def _log(values: Sequence[float], floor: float) -> list[float]:
    return [max(v, floor) if math.isfinite(v) else float("nan") for v in values]


def _series_panel(ax, x, series, title: str, threshold: float | None = None) -> float:
    floor = floor_of([v for _, vals, _ in series for v in vals] + ([threshold] if threshold else []))
    for name, vals, style in series:
        ax.plot(x, _log(vals, floor), style, label=name, markersize=4)
    if threshold is not None:
        ax.axhline(threshold, color="red", linestyle="--", linewidth=1, label=f"threshold {threshold:g}")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.set_ylabel(f"zeros drawn at {floor:.0e}", fontsize=7)
    return floor


def fig_points(pair: PairResult, threshold: float | None) -> str:
    plt = plots.plt()
    labels = pair.labels
    x = list(range(len(labels)))
    s = [pair.points[k] for k in labels]
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.6))
    plots.margins(fig, left=0.8, bottom=0.9, top=0.6, wspace=0.3)
    _series_panel(axes[0], x, [("aggregate", [p.rel_l2 for p in s], "o-"), ("p50 token", [p.p50 for p in s], "s--"),
                               ("p90 token", [p.p90 for p in s], "^--"), ("max token", [p.max for p in s], "v:")],
                  "relative L2", threshold)
    _series_panel(axes[1], x, [("1 - mean cosine", [1 - p.cosine for p in s], "o-"),
                               ("1 - min cosine", [1 - p.cosine_min for p in s], "v:")], "cosine distance")
    _series_panel(axes[2], x, [("max abs", [p.max_abs for p in s], "o-")], "max abs difference")
    for ax in axes:
        ax.set_xticks(x, labels, rotation=45, fontsize=8)
        if pair.verdict.onset in labels:
            ax.axvline(labels.index(pair.verdict.onset), color="orange", alpha=0.6, linewidth=3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{pair.name}: per point (orange: first divergent point)", fontsize=10)
    return plots.png(fig)


def _profile_points(pair: PairResult) -> list[str]:
    labels = pair.labels
    chosen = [labels[min(1, len(labels) - 1)], pair.verdict.onset, labels[len(labels) // 2], labels[-1]]
    return [c for i, c in enumerate(chosen) if c and c not in chosen[:i]]


def fig_positions(pair: PairResult) -> str:
    plt = plots.plt()
    fig, ax = plt.subplots(figsize=(9, 3.4))
    plots.margins(fig, left=0.9, bottom=0.6, top=0.35)
    chosen = _profile_points(pair)
    _series_panel(ax, None, [], f"{pair.name}: per-position profile")
    floor = floor_of([v for label in chosen for v in pair.points[label].profile])
    for label in chosen:
        prof = pair.points[label].profile
        ax.plot(range(len(prof)), _log(prof, floor), label=label, linewidth=1)
    ax.set_xlabel("position in the sample")
    ax.set_ylabel(f"mean per-token rel L2 (zeros at {floor:.0e})", fontsize=8)
    ax.legend(fontsize=8)
    return plots.png(fig)


def fig_overview(pairs: Sequence[PairResult]) -> str:
    plt = plots.plt()
    fig, ax = plt.subplots(figsize=(9, 3.4))
    plots.margins(fig, left=1.0, bottom=0.9, top=0.35)
    floor = floor_of([p.points[k].judged_rel_l2 for p in pairs for k in p.labels])
    for p in pairs:
        ax.plot(range(len(p.labels)), _log([p.points[k].judged_rel_l2 for k in p.labels], floor), "o-",
                markersize=4, label=p.name)
        ax.set_xticks(range(len(p.labels)), p.labels, rotation=45, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel(f"max(aggregate, p90 token) rel L2\n(zeros at {floor:.0e})", fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("every engine against the reference", fontsize=10)
    return plots.png(fig)


def fig_alignment(al: Alignment) -> str:
    plt = plots.plt()
    import numpy as np

    raw = np.array(al.distances, dtype=float)
    floor = floor_of(raw.ravel().tolist())
    d = np.log10(np.maximum(raw, floor))
    fig, ax = plt.subplots(figsize=(max(5, 0.45 * len(al.cols) + 3), max(2.5, 0.4 * len(al.rows) + 2)))
    plots.margins(fig, left=1.3, bottom=1.2, top=0.35, right=0.2)  # the colorbar takes its room from the axes
    im = ax.imshow(d, cmap="viridis_r", aspect="auto")
    ax.set_xticks(range(len(al.cols)), al.cols, rotation=45, fontsize=8)
    ax.set_yticks(range(len(al.rows)), [f"claims {r}" for r in al.rows], fontsize=8)
    ax.set_xlabel(f"reference point ({al.reference})")
    for i, m in enumerate(al.matches):
        j = al.cols.index(m.matched)
        ax.plot(j, i, marker="x", color="red" if m.status != Match.OK else "white", markersize=10, mew=2)
        if m.claimed in al.cols:
            ax.add_patch(plt.Rectangle((al.cols.index(m.claimed) - 0.5, i - 0.5), 1, 1, fill=False,
                                       edgecolor="orange", linewidth=2))
    fig.colorbar(im, ax=ax, label=f"log10 median per-token rel L2 (zeros at {floor:.0e})")
    ax.set_title(f"alignment of {al.engine} (x: best match, box: claimed)", fontsize=10)
    return plots.png(fig)


def _table(header: Sequence[str], rows: list[list[str]], status_cols: Sequence[int] = ()) -> dict:
    return {"header": list(header), "rows": [[str(c) for c in row] for row in rows], "status_cols": tuple(status_cols)}


def _pair(pair: PairResult, threshold: float | None, plots: bool) -> dict:
    figures = []
    if plots:
        figures.append(fig_points(pair, threshold))
        if pair.kind in (PairKind.REFERENCE, PairKind.PAIR) or pair.verdict.onset:
            figures.append(fig_positions(pair))
    v = pair.verdict
    return {"name": pair.name, "status": v.status, "dtype": v.dtype, "headline": v.headline,
            "figures": list(map(Markup, figures)), "table": _table(POINT_HEADER, point_rows(pair), status_cols=(1,)),
            "logits": pair.logits}


def _alignment(al: Alignment) -> dict:
    rows = [[x.claimed, x.matched, f"{x.distance:.2e}", "-" if x.claimed_distance is None else
             f"{x.claimed_distance:.2e}", f"{x.runner_up} {x.runner_up_distance or 0:.2e}", f"{x.votes:.0%}",
             x.status] for x in al.matches]
    return {"engine": al.engine, "status": al.status, "figure": Markup(fig_alignment(al)),
            "table": _table(["claimed", "matched", "distance", "to claimed", "runner-up", "votes", "status"], rows,
                            status_cols=(6,)),
            "problems": al.problems, "problem_class": Status.FAIL if al.status == Check.FAIL else Status.WARN,
            "notes": al.notes}


def _sections(result: DiffResult) -> list[dict]:
    sections = []
    for kind, title in KIND_TITLE.items():
        pairs = [p for p in result.pairs if p.kind == kind]
        if pairs:
            plots = kind in (PairKind.REFERENCE, PairKind.PAIR)
            sections.append({"title": title, "pairs": [
                _pair(p, result.thresholds.get(p.verdict.dtype, {}).get("rel_l2"),
                      plots=plots or p.verdict.status != Status.PASS) for p in pairs]})
    return sections


def to_html(result: DiffResult) -> str:
    storage = None
    if result.storage:
        storage = {"title": storage_title(result), **_table(STORAGE_HEADER, storage_rows(result))}
    ref_pairs = [p for p in result.pairs if p.kind == PairKind.REFERENCE]
    anchors = [[a.engine, a.check, f"{a.rel_l2:.2e}", a.status, a.detail] for a in result.anchors]
    return _TEMPLATE.render(
        r=result, css=_CSS, engines=_table(ENGINE_HEADER, engine_rows(result)), storage=storage,
        overview=Markup(fig_overview(ref_pairs)) if ref_pairs else None,
        alignments=[_alignment(al) for al in result.alignments],
        anchors=_table(["engine", "check", "rel L2", "status", "detail"], anchors, status_cols=(3,)) if anchors else None,
        sections=_sections(result))


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pipeline.compare.html", description="draw report.html from a report.json")
    parser.add_argument("report_dir", type=path_arg, help="a run's diff/ directory (its gate draws no plots unless it "
                        "fails) or the out_dir of python -m pipeline.diff")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m pipeline.compare.html REPORT_DIR`: draw report.html from the report.json in REPORT_DIR."""
    args = parser().parse_args(argv)
    try:
        result = load(args.report_dir)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(ExitCode.USAGE)
    print(write_html(result, args.report_dir).resolve())


def write_html(result: DiffResult, out_dir: Path) -> Path:
    """report.html in out_dir, drawn from `result`."""
    path = Path(out_dir) / REPORT_HTML
    write_text_atomic(path, to_html(result))
    return path


if __name__ == "__main__":
    main()
