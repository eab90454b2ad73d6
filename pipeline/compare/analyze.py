"""From engine runs to a verdict: every pair, every point, the alignment matrix, the checkpoint anchors, logits.

Judged (they decide the verdict): each engine against the reference, each engine against itself (the same batch
twice: determinism; samples alone vs in the batch: batch composition), each engine's alignment, each engine's anchors
(b0 is the checkpoint's embedding row; final_norm is the checkpoint's RMSNorm of bN). Reported only: engine pairs
that do not involve the reference.
"""
from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from pipeline.compare.align import Alignment, align
from pipeline.compare.anchors import Checkpoint
from pipeline.compare.judge import (
    PRECISION,
    LogitStats,
    Verdict,
    judge_logits,
    judge_points,
    over_reasons,
    pair_dtype,
    relocate,
)
from pipeline.compare.kinds import Check, PairKind, Status
from pipeline.compare.metrics import PointStats, point_stats
from pipeline.compare.probe import ProbeCapture
from pipeline.config import DiffConfig, Thresholds
from pipeline.core.contracts import PreparedSample
from pipeline.points import FINAL_NORM, Point, canonical_order


@dataclass(kw_only=True)
class PairResult:
    kind: PairKind
    a: str  # the side relative errors are measured against
    b: str
    name: str
    labels: list[str]
    points: dict[str, PointStats]
    logits: LogitStats | None
    verdict: Verdict
    judged: bool  # counts toward the overall verdict


@dataclass(kw_only=True)
class AnchorCheck:
    engine: str
    check: str  # embedding | final_norm
    rel_l2: float
    max_abs: float
    status: Check
    detail: str


@dataclass(frozen=True, kw_only=True)
class DiffResult:
    """A finished comparison: `compare` returns it complete and nothing changes it afterwards."""
    status: Status
    reference: str
    runs: list[ProbeCapture]
    pairs: list[PairResult] = field(default_factory=list)
    alignments: list[Alignment] = field(default_factory=list)
    anchors: list[AnchorCheck] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    probe: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    thresholds: dict[str, Any] = field(default_factory=dict)  # per dtype, as configured
    seconds: dict[str, float] = field(default_factory=dict)
    # runner.storage_dtype's rounding of each compared engine's states: {"dtype", "scaling", "rel_l2": {engine:
    # {point: x}}}; None when states are stored as captured
    storage: dict[str, Any] | None = None


class Analysis:
    def __init__(self, runs: Sequence[ProbeCapture], reference: str, *, ckpt: Checkpoint, cfg: DiffConfig,
                 num_layers: int, samples: Sequence[PreparedSample]) -> None:
        self.runs = {r.label: r for r in runs}
        self.reference = reference
        self.ckpt, self.cfg, self.num_layers, self.samples = ckpt, cfg, num_layers, samples
        self.moe = ckpt.moe_layers
        self._normed_cache: dict[str, tuple[torch.Tensor, str] | None] = {}
        self.notes: list[str] = []

    def thresholds(self, dtype: str) -> Thresholds:
        return self.cfg.thresholds[dtype]

    def dtype_of(self, *runs: ProbeCapture) -> str:
        """The dtype a comparison is judged by: the least precise one the engines report (never a silent guess)."""
        for r in runs:
            if r.dtype not in self.cfg.thresholds:
                note = (f"{r.label} reports compute dtype {r.dtype!r}, which diff.thresholds does not list; its "
                        f"comparisons are judged with the least precise tolerances listed")
                if note not in self.notes:
                    self.notes.append(note)
        dtypes = [r.dtype for r in runs]
        judged = pair_dtype(dtypes[0], dtypes[-1])
        return judged if judged in self.cfg.thresholds else min(self.cfg.thresholds, key=lambda d: PRECISION.get(d, 0))

    # --- logits ------------------------------------------------------------------------------------------------
    def _normed(self, run: ProbeCapture) -> tuple[torch.Tensor, str] | None:
        if FINAL_NORM in run.labels:
            return torch.cat([x.float() for x in run.point(FINAL_NORM)]), "final_norm"
        last = f"b{self.num_layers}"
        if last in run.labels:
            return self.ckpt.final_norm(torch.cat([x.float() for x in run.point(last)])), f"{last} + checkpoint norm"
        return None

    def normed(self, run: ProbeCapture) -> tuple[torch.Tensor, str] | None:
        if run.label not in self._normed_cache:
            self._normed_cache[run.label] = self._normed(run)
        return self._normed_cache[run.label]

    def logit_stats(self, a: ProbeCapture, b: ProbeCapture) -> LogitStats | None:
        if not self.cfg.logits:
            return None
        na, nb = self.normed(a), self.normed(b)
        if na is None or nb is None:
            return None
        same, kl = self.ckpt.compare_logits(na[0], nb[0])
        q = torch.quantile(kl.double(), torch.tensor([0.99, 1.0], dtype=torch.float64))
        return LogitStats(num_tokens=int(kl.shape[0]), top1=float(same.float().mean()), kl_mean=float(kl.mean()),
                          kl_p99=float(q[0]), kl_max=float(q[1]), source_a=na[1], source_b=nb[1])

    # --- pairs -------------------------------------------------------------------------------------------------
    def _stats(self, a_parts, b_parts) -> PointStats:
        return point_stats(a_parts, b_parts, token_level=self.cfg.routing_flips.token_level)

    def _judge(self, kind: PairKind, name: str, labels: list[str], stats: dict[str, PointStats], dtype: str,
               logits: LogitStats | None, judged: bool, a: str, b: str) -> PairResult:
        t = self.thresholds(dtype)
        v = judge_points(stats, labels, name=name, dtype=dtype, t=t, flip_cfg=self.cfg.routing_flips,
                         moe=self.moe, num_layers=self.num_layers)
        judge_logits(v, logits, t, name)
        return PairResult(kind=kind, a=a, b=b, name=name, labels=labels, points=stats, logits=logits, verdict=v,
                          judged=judged)

    def engine_pair(self, a: ProbeCapture, b: ProbeCapture, kind: PairKind) -> PairResult:
        labels = [p.label for p in canonical_order(p for p in b.points if p in set(a.points))]
        stats = {x: self._stats(a.point(x), b.point(x)) for x in labels}
        name = f"{b.label} vs {a.label}"
        return self._judge(kind, name, labels, stats, self.dtype_of(a, b), self.logit_stats(a, b),
                           kind == PairKind.REFERENCE, a.label, b.label)

    def determinism(self, run: ProbeCapture) -> list[PairResult]:
        out = []
        for k in range(1, len(run.repeats) + 1):
            stats = {x: self._stats(run.point(x), run.point(x, f"repeat{k}")) for x in run.labels}
            out.append(self._judge(PairKind.DETERMINISM, f"{run.label} run {k + 1} vs run 1", run.labels, stats,
                                   self.dtype_of(run),
                                   None, True, f"{run.label} run 1", f"{run.label} run {k + 1}"))
        return out

    def batch(self, run: ProbeCapture) -> PairResult | None:
        if not run.alone:
            return None
        idx = sorted(run.alone)
        stats = {x: self._stats(run.point(x, "alone"), run.point(x, "batch", idx)) for x in run.labels}
        name = f"{run.label} in a batch of {len(self.samples)} vs alone"
        return self._judge(PairKind.BATCH, name, run.labels, stats, self.dtype_of(run), None, True,
                           f"{run.label} alone", f"{run.label} in batch")

    # --- anchors -----------------------------------------------------------------------------------------------
    def anchors(self, run: ProbeCapture) -> list[AnchorCheck]:
        t = self.thresholds(self.dtype_of(run))
        out = []
        if "b0" in run.labels:
            table = [self.ckpt.embedding_rows(s.input_ids_T.tolist()) for s in self.samples]
            out.append(self._anchor(run, "embedding", table, run.point("b0"), t,
                                    "b0 is the checkpoint's embedding row of each token"))
        last = f"b{self.num_layers}"
        if last in run.labels and FINAL_NORM in run.labels:
            normed = [self.ckpt.final_norm(x) for x in run.point(last)]
            out.append(self._anchor(run, "final_norm", normed, run.point(FINAL_NORM), t,
                                    f"final_norm is the checkpoint's RMSNorm of {last}"))
        return out

    def _anchor(self, run: ProbeCapture, check: str, expected, got, t: Thresholds, claim: str) -> AnchorCheck:
        s = self._stats(expected, got)
        reasons = over_reasons(s, t)
        detail = claim + (": " + "; ".join(reasons) if reasons else f" (rel L2 {s.rel_l2:.2e})")
        return AnchorCheck(engine=run.label, check=check, rel_l2=s.rel_l2, max_abs=s.max_abs,
                           status=Check.FAIL if reasons else Check.OK, detail=detail)

    # --- all ---------------------------------------------------------------------------------------------------
    def _against_reference(self, others: Sequence[ProbeCapture]) -> tuple[list[PairResult], list[Alignment]]:
        """Each engine against the reference, with its alignment (which explains a failing onset when it can)."""
        ref = self.runs[self.reference]
        pairs, alignments = [], []
        for r in others if ref.ok else []:
            pair = self.engine_pair(ref, r, PairKind.REFERENCE)
            v = pair.verdict
            al = align(r, ref, self.cfg.alignment, diverged_from=v.onset if v.status == Status.FAIL else None)
            explained = al.problem_for(v.onset) if v.onset else None
            if explained and v.status == Status.FAIL:
                relocate(v, pair.name, f"capture convention, not numerics: {explained}")
            alignments.append(al)
            pairs.append(pair)
        return pairs, alignments

    def run(self) -> DiffResult:
        """Every comparison, collected into one finished DiffResult (the caller adds what the analysis cannot
        know with `dataclasses.replace`)."""
        ok = [r for r in self.runs.values() if r.ok]
        others = [r for r in ok if r.label != self.reference]
        pairs, alignments = self._against_reference(others)
        pairs += [self.engine_pair(a, b, PairKind.PAIR) for a, b in itertools.combinations(others, 2)]
        anchors: list[AnchorCheck] = []
        for r in ok:
            pairs += self.determinism(r)
            batch = self.batch(r)
            if batch is not None:
                pairs.append(batch)
            anchors += self.anchors(r)
        failures, warnings = _findings(list(self.runs.values()), self.notes, alignments, anchors, pairs)
        status = Status.FAIL if failures else (Status.WARN if warnings else Status.PASS)
        return DiffResult(status=status, reference=self.reference,
                          runs=list(self.runs.values()), pairs=pairs, alignments=alignments, anchors=anchors,
                          failures=failures, warnings=warnings,
                          thresholds={k: dataclasses.asdict(v) for k, v in self.cfg.thresholds.items()})


def _findings(runs: Sequence[ProbeCapture], notes: Sequence[str], alignments: Sequence[Alignment],
              anchors: Sequence[AnchorCheck], pairs: Sequence[PairResult]) -> tuple[list[str], list[str]]:
    """(failures, warnings) of the whole comparison, in the order the report lists them."""
    failures, warnings = [], list(notes)
    for r in runs:
        if r.start_failed:  # nothing was compared with it: not a numerics or convention finding
            failures.append(f"engine {r.label} failed to start: {r.error}")
        elif r.error:
            failures.append(f"engine {r.label} did not run: {r.error}")
    for al in alignments:
        (failures if al.status == Check.FAIL else warnings).extend(f"alignment: {p}" for p in al.problems)
    failures += [f"{an.engine}: {an.detail}" for an in anchors if an.status == Check.FAIL]
    for pair in pairs:
        if pair.judged:
            failures += pair.verdict.failures
            warnings += pair.verdict.warnings
    return failures, warnings


def all_points(num_layers: int) -> list[Point]:
    return [Point(b) for b in range(num_layers + 1)] + [Point(None)]
