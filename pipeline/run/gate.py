"""The diff as a gate of `python -m pipeline.extract`: before any shard is written, a probe subset goes through the
reference (and `gate.engines`) and through the primary engine; over the thresholds, or with any capture point
not where its engine claims it is, the run stops (gate.mode=stop) or warns (gate.mode=warn).

Engine lifetimes: the reference engines are started, probed and closed first (on a GPU node they need the devices the
primary will use); the primary is started once by the job, probed here, and then captures the run. Only the primary
gets the self-checks (gate.probe: by default one sample alone vs in the batch, which also shows run-to-run
non-determinism); it is the engine whose states are written.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from pipeline.compare.analyze import DiffResult, all_points
from pipeline.compare.kinds import PairKind, Role, Status
from pipeline.compare.lineup import comparison
from pipeline.compare.probe import ProbeCapture, ProbeRequest, capture_probe, probe_engine, probe_samples
from pipeline.compare.report import write_html, write_report
from pipeline.compare.serialize import summary
from pipeline.compare.job import compare, report_config
from pipeline.config import ConfigError, ExtractConfig
from pipeline.core.cli import Refused
from pipeline.core.contracts import PreparedSample
from pipeline.models.info import ModelInfo
from pipeline.points import Point
from pipeline.run.executor import Executor
from pipeline.shards.layout import DIFF_DIR, REPORT_HTML  # DIFF_DIR: the gate's report, inside the run directory

log = logging.getLogger(__name__)


class DiffGateError(Refused, RuntimeError):
    """The gate stopped the run; the message names what failed and where the report is."""

    prefix = "stopped by the diff gate"


@dataclass(kw_only=True)
class GateOutcome:
    mode: str  # stop | warn | off
    status: Status
    summary: dict[str, Any]
    report_dir: Path | None = None
    parts: dict[str, float] = field(default_factory=dict)  # where the gate's time went
    result: DiffResult | None = None
    lines: list[str] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        """The gate's whole cost, report.html drawn after the run included."""
        return sum(self.parts.values())


def off() -> GateOutcome:
    return GateOutcome(mode="off", status=Status.OFF, summary={"status": Status.OFF, "gate": "off"})


class GateOff:
    """gate.mode=off: nothing is probed or compared; the outcome says the gate was off."""

    def probe_references(self, samples: Sequence[PreparedSample], executor: Executor) -> None:
        pass

    def check(self, executor: Executor) -> GateOutcome:
        return off()

    def finish(self) -> None:
        pass


def primary_label(cfg: ExtractConfig) -> str:
    e = cfg.engine
    return f"{e.name}{'' if e.dtype == 'auto' else '@' + e.dtype} (primary)"


class DiffGate:
    def __init__(self, cfg: ExtractConfig, model: ModelInfo, points: Sequence[Point], out_dir: Path,
                 others: list[ProbeRequest]) -> None:
        self.cfg, self.model, self.points, self.out_dir, self.others = cfg, model, list(points), out_dir, others
        self.runs: list[ProbeCapture] = []
        self.samples: list[PreparedSample] = []
        self.seconds: dict[str, float] = {}
        self._html_due = False
        self.outcome: GateOutcome | None = None

    @classmethod
    def create(cls, cfg: ExtractConfig, model: ModelInfo, points: Sequence[Point],
               out_dir: Path) -> "DiffGate | GateOff":
        """GateOff when gate.mode=off. Resolves the reference entries (config errors surface here, before any work)."""
        if cfg.gate.mode == "off":
            return GateOff()
        others = comparison(cfg.diff.reference, cfg.gate.engines, "gate.engines", model=model,
                            all_points=all_points(model.num_layers), points=points,
                            trust_remote_code=cfg.model.trust_remote_code)
        for request in others:  # constructing loads nothing; an engine whose environment is absent fails here
            try:
                request.make(model.num_layers)
            except FileNotFoundError as err:
                raise ConfigError(f"diff gate engine {request.label} ({request.role}): {err}") from err
        return cls(cfg, model, points, out_dir, others)

    def probe_references(self, samples: Sequence[PreparedSample], executor: Executor) -> None:
        """Start, probe and close every engine other than the primary (once each, no self-checks), each where the
        executor runs a replica (`executor.run_beside`: on Ray, a task with a replica's GPUs)."""
        t0 = time.perf_counter()
        probe = self.cfg.gate.probe
        self.samples = probe_samples(samples, probe)
        once = dataclasses.replace(probe, repeats=1, alone=0)
        for request in self.others:
            log.info("diff gate: probing %s (%s)", request.label, request.role)
            self.runs.append(executor.run_beside(probe_engine, request, self.samples, once,
                                                 num_layers=self.model.num_layers, hidden_size=self.model.hidden_size))
        self.seconds["references"] = time.perf_counter() - t0
        if self.cfg.gate.mode == "stop" and any(r.start_failed for r in self.runs):
            # Nothing to hold the primary against: stop before it starts (on a real model, minutes of loading).
            self._conclude(self.runs)

    def check(self, executor: Executor) -> GateOutcome:
        """Probe the started primary engine through its executor, compare, write the report; stop (raise
        DiffGateError) or warn when it fails."""
        t0 = time.perf_counter()
        c = self.cfg
        request = ProbeRequest(label=primary_label(c), role=Role.PRIMARY, spec=c.engine,
                               model_path=str(self.model.path), points=self.points,
                               trust_remote_code=c.model.trust_remote_code)
        # An error is in the capture: the report says so and the gate fails.
        run = capture_probe(request, executor, self.samples, c.gate.probe, hidden_size=self.model.hidden_size)
        self.seconds["primary probe"] = time.perf_counter() - t0
        return self._conclude([*self.runs, run])

    def _conclude(self, runs: list[ProbeCapture]) -> GateOutcome:
        """Compare the probed runs, write the report; stop (raise DiffGateError) or warn when the verdict fails."""
        t1 = time.perf_counter()
        c = self.cfg
        result = compare(runs, reference=self.others[0].label, model=self.model, samples=self.samples,
                         cfg=c.diff, storage_dtype=c.runner.storage_dtype)
        t2 = time.perf_counter()
        self.seconds["analysis"] = t2 - t1
        report_dir = self.out_dir / DIFF_DIR
        result = dataclasses.replace(result, seconds={**result.seconds,
                                                      **{f"gate {k}": v for k, v in self.seconds.items()}})
        # Plots are for people, not for the decision: drawn now when the gate fails (the stop message points at
        # them), after the run for gate.html=always, and otherwise on demand from report.json.
        fails = result.status == Status.FAIL
        self._html_due = not fails and c.gate.html == "always"
        write_report(result, report_dir, config=report_config(c.diff, command="pipeline.extract gate",
                                                              gate=dataclasses.asdict(c.gate)),
                     html=fails and c.gate.html != "never")
        self.seconds["report"] = time.perf_counter() - t2
        outcome = GateOutcome(mode=c.gate.mode, status=result.status, report_dir=report_dir,
                              parts=dict(self.seconds), result=result,
                              summary=summary(result, report=f"{DIFF_DIR}/report.json"),
                              lines=result.failures + result.warnings)
        if result.status == Status.FAIL:
            message = _stop_message(result, report_dir)
            if c.gate.mode == "stop":
                raise DiffGateError(message)
            log.warning("diff gate (gate.mode=warn, capturing anyway): %s", message)
        self.outcome = outcome
        return outcome

    def finish(self) -> None:
        """After the run: report.html of a gate that did not fail, with gate.html=always (its time is counted in
        the gate's cost)."""
        if not self._html_due or self.outcome is None or self.outcome.result is None:
            return
        t0 = time.perf_counter()
        write_html(self.outcome.result, self.outcome.report_dir)
        self.outcome.parts["report.html (after the run)"] = time.perf_counter() - t0
        self._html_due = False


def _where(report_dir: Path) -> str:
    d = report_dir.resolve()
    if (d / REPORT_HTML).is_file():
        return f"report: {d}/report.html (report.json, report.md beside it)"
    return f"report: {d}/report.md (report.json beside it; plots: python -m pipeline.compare.html {d})"


def _stop_message(result: DiffResult, report_dir: Path) -> str:
    unstarted = [r for r in result.runs if r.start_failed]
    if unstarted:
        return ("the diff gate could not compare the engines, before any shard was written:\n"
                + "\n".join(f"  - engine {r.label} ({r.role}) failed to start: {r.error}" for r in unstarted) + "\n"
                + _where(report_dir) + "\nfix what stops that engine from starting (its options are in "
                "diff.reference / gate.engines), or pass gate.mode=warn to capture without it")
    shown = result.failures[:4]
    more = f"\n  ... and {len(result.failures) - len(shown)} more" if len(result.failures) > len(shown) else ""
    return ("the diff gate found the primary engine out of line with the reference, before any shard was written:\n"
            + "\n".join(f"  - {f}" for f in shown) + more + "\n" + _where(report_dir)
            + "\nfix the engine or its capture convention, or pass gate.mode=warn to capture anyway")


def gate_lines(outcome: GateOutcome, run_seconds: float) -> list[str]:
    """What extract prints about its gate: verdict, cost (absolute and as a fraction of the run), report, findings."""
    if outcome.mode == "off":
        return ["diff gate: off (gate.mode=off)"]
    share = outcome.seconds / run_seconds if run_seconds > 0 else 0.0
    parts = ", ".join(f"{k} {v:.1f}s" for k, v in outcome.parts.items())
    lines = [f"diff gate: {outcome.status} (gate.mode={outcome.mode}) in {outcome.seconds:.1f}s = {share:.1%} of this "
             f"run ({parts}); {_where(outcome.report_dir) if outcome.report_dir else 'no report'}"]
    return lines + [f"  - {x}" for x in outcome.lines[:6]]


def primary_divergence(outcome: GateOutcome) -> tuple[str, dict[str, float]] | None:
    """(pair name, rel L2 per point) of the primary engine against the reference, as the gate measured it."""
    result = outcome.result
    primary = next((r.label for r in result.runs if r.role == Role.PRIMARY), None) if result else None
    pair = next((p for p in result.pairs if p.kind == PairKind.REFERENCE and p.b == primary), None) if result else None
    return None if pair is None else (pair.name, {k: s.rel_l2 for k, s in pair.points.items()})


def storage_lines(storage: dict[str, Any] | None, outcome: GateOutcome) -> list[str]:
    """What extract prints about storage: bytes on disk per token, and (fp8) the rounding error per point beside the
    divergence between the engines the gate measured, so a user sees which one is larger."""
    if not storage:
        return []
    dtype, capture = storage["dtype"], storage["capture_dtype"]
    stored, captured = storage["hidden_bytes_per_token"], storage["capture_hidden_bytes_per_token"]
    how = "as captured" if dtype == capture else f"{storage['scaling']} scaling, captured in {capture}: " \
        f"{stored / captured:.2f}x of {captured:,.0f} B/token"
    lines = [f"storage: hidden states {dtype}, {stored:,.0f} B/token on disk ({how}); shard files "
             f"{storage['shard_bytes_per_token']:,.0f} B/token"]
    if dtype == capture:
        return lines
    diverged = primary_divergence(outcome)
    lines.append("  storage rounding (rel L2, read back vs captured)" + (
        f" beside the engines' divergence ({diverged[0]}, diff gate)" if diverged else " (diff gate off: no "
        "engine divergence measured)") + ":")
    for point, rounding in storage["rounding_rel_l2"].items():
        engines = diverged[1].get(point) if diverged else None
        beside = "" if engines is None else f"  engines {engines:.2e}" + (
            f"  ({rounding / engines:.2f}x)" if engines > 0 else "")
        lines.append(f"    {point:>10}: storage {rounding:.2e}{beside}")
    return lines
