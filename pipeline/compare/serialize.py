"""report.json and the compact summary: a DiffResult to JSON and back.

report.json holds everything report.md and report.html show: `from_dict` rebuilds the DiffResult, so report.html
can be drawn later, on any machine (`python -m pipeline.compare.html DIR`). The summary is the small record that goes
into the manifest and every shard.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from pipeline.compare.align import Alignment, PointMatch
from pipeline.compare.analyze import AnchorCheck, DiffResult, PairResult
from pipeline.compare.judge import LogitStats, Verdict
from pipeline.compare.kinds import PairKind, Role, Status, Step
from pipeline.compare.metrics import PointStats
from pipeline.compare.probe import ProbeCapture, ProbeRequest
from pipeline.core.contracts import EngineSpec
from pipeline.core.jsonfile import read
from pipeline.points import parse_points

FORMAT = "pipeline.diff/1"
_SPEC_FIELDS = {f.name for f in dataclasses.fields(EngineSpec)}


def _clean(x: Any) -> Any:
    """JSON-safe: non-finite floats become strings ('nan', 'inf')."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def _spec(config: dict[str, Any]) -> EngineSpec:
    return EngineSpec(**{k: v for k, v in config.items() if k in _SPEC_FIELDS})


def _engine(run: ProbeCapture) -> dict[str, Any]:
    return {"label": run.label, "role": run.role, "config": run.config, "points": run.labels, "info": run.info,
            "error": run.error, "failed_at": run.failed_at, "ran_on": run.ran_on,
            "seconds": {k: round(v, 3) for k, v in run.seconds.items()}}


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
        "storage": result.storage,
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
    verdict = Verdict(status=Status(d["status"]), dtype=d["dtype"], onset=d["onset"], last_within=d["last_within"],
                      locus=d["locus"], routing_flips=d["routing_flips"], point_status=d["point_status"],
                      failures=d["failures"], warnings=d["warnings"], headline=d.get("headline", ""))
    return PairResult(kind=PairKind(d["kind"]), a=d["a"], b=d["b"], name=d["name"],
                      labels=d.get("labels", list(points)),
                      points=points, logits=_revive(LogitStats, d["logits"]) if d["logits"] else None,
                      verdict=verdict, judged=d["judged"])


def _alignment_from(d: dict[str, Any]) -> Alignment:
    return _revive(Alignment, {**d, "matches": [_revive(PointMatch, m) for m in d["matches"]]})


def _step(value: str | None) -> Step | None:
    return None if value is None else Step(value)


def from_dict(data: dict[str, Any]) -> DiffResult:
    """The DiffResult a report.json was written from (everything its report.md and report.html show)."""
    if data.get("format") != FORMAT:
        raise ValueError(f"format {data.get('format')!r} is not a {FORMAT} report")
    num_layers = data["model"]["num_layers"]
    runs = [ProbeCapture(request=ProbeRequest(label=e["label"], role=Role(e["role"]), spec=_spec(e["config"]),
                                              model_path=e["config"].get("model_path"),
                                              points=parse_points(e["points"], num_layers=num_layers)),
                         info=e["info"], error=e["error"], failed_at=_step(e.get("failed_at")), ran_on=e.get("ran_on"),
                         seconds=e["seconds"])
            for e in data["engines"]]
    return DiffResult(status=Status(data["status"]), reference=data["reference"], runs=runs,
                      pairs=[_pair_from(p) for p in data["pairs"]],
                      alignments=[_alignment_from(a) for a in data["alignment"]],
                      anchors=[_revive(AnchorCheck, a) for a in data["anchors"]],
                      failures=data["failures"], warnings=data["warnings"], probe=data["probe"], model=data["model"],
                      thresholds=data["config"].get("thresholds", {}), seconds=data["seconds"],
                      storage=data.get("storage"))


def load(report_dir: Path) -> DiffResult:
    """The DiffResult of `report_dir/report.json`; a clear error when there is none or it is not a diff report."""
    path = Path(report_dir) / "report.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (a report directory holds report.json: the run's diff/, or "
                                "the out_dir of python -m pipeline.diff)")
    try:
        return from_dict(read(path, ValueError))  # bounded in size and nesting
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a readable {FORMAT} report ({type(e).__name__}: {e})") from e


def _sig(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else float(f"{x:.{digits}g}")


def summary(result: DiffResult, *, report: str) -> dict[str, Any]:
    """The compact record for the manifest and every shard: no timings, 3 significant digits (stable on reruns of
    deterministic engines, so a resumed run keeps its provenance digest)."""
    pairs = {}
    for p in result.pairs:
        if p.kind != PairKind.REFERENCE:
            continue
        worst = max((s.rel_l2 for s in p.points.values()), default=0.0)
        pairs[p.name] = {"dtype": p.verdict.dtype, "status": p.verdict.status, "first_divergent": p.verdict.onset,
                         "locus": p.verdict.locus, "routing_flips": p.verdict.routing_flips,
                         "worst_rel_l2": _sig(worst),
                         "top1": _sig(p.logits.top1) if p.logits else None,
                         "kl": _sig(p.logits.kl_mean) if p.logits else None}
    checks = {p.name: p.verdict.status for p in result.pairs if p.kind in (PairKind.DETERMINISM, PairKind.BATCH)}
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
