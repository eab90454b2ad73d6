"""The probe: a few prepared samples, run through one engine as a batch (repeated) and one by one.

`ProbeRequest` is one engine of a comparison (its spec, checkpoint and points); `ProbeCapture` is what it returned:
the batch capture (per sample `[T, P, H]` in the engine's dtype), its repeats (run-to-run determinism), captures of
some samples alone (batch-composition dependence), what the engine reports it ran, and timings. An engine that
fails is recorded with its error, so a multi-engine report still shows the others.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import torch

from pipeline.compare.kinds import Role, Step
from pipeline.config import ProbeConfig
from pipeline.core.contracts import Capture, EngineInfo, EngineSpec, PreparedSample
from pipeline.engines.base import Engine, first_line
from pipeline.engines.registry import make_engine
from pipeline.points import Point
from pipeline.shards.validate import check_capture

log = logging.getLogger(__name__)


class ProbeError(RuntimeError):
    """An engine returned something that cannot be compared (wrong ids, shape, non-finite values)."""


class Probeable(Protocol):
    """What a probe needs: an Engine, or a started executor (which captures on its primary replica)."""

    def capture(self, samples: Sequence[PreparedSample]) -> list[Capture]: ...

    def info(self) -> EngineInfo: ...


def probe_samples(samples: Sequence[PreparedSample], probe: ProbeConfig) -> list[PreparedSample]:
    """The first `num_samples` samples, each cut to its first `max_tokens` tokens (the same ids for every engine)."""
    out = []
    for s in list(samples)[: probe.num_samples]:
        n = min(s.num_tokens, probe.max_tokens)
        out.append(dataclasses.replace(s, input_ids_T=s.input_ids_T[:n].copy(), loss_mask_T=s.loss_mask_T[:n].copy(),
                                       truncated=s.truncated or n < s.num_tokens))
    if not out:
        raise ProbeError("the data has no prepared samples to probe with")
    return out


@dataclass(frozen=True, kw_only=True)
class ProbeRequest:
    """One engine of a comparison, as asked for: what to make and which points it captures."""
    label: str
    role: Role
    spec: EngineSpec
    model_path: str
    points: list[Point]
    trust_remote_code: bool = False  # model.trust_remote_code

    @property
    def config(self) -> dict[str, Any]:
        """The engine as resolved, for reports."""
        return {**self.spec.to_dict(), "model_path": self.model_path}

    @property
    def labels(self) -> list[str]:
        return [p.label for p in self.points]

    def make(self, num_layers: int, max_seq_len: int | None = None) -> Engine:
        return make_engine(self.spec, model_path=self.model_path, points=self.points, num_layers=num_layers,
                           trust_remote_code=self.trust_remote_code, max_seq_len=max_seq_len)


@dataclass(frozen=True, kw_only=True)
class ProbeCapture:
    """What one engine returned for its request. Built once by the probe functions and returned (on Ray it is
    pickled back to the driver), never filled in afterwards."""
    request: ProbeRequest
    info: dict[str, Any] | None = None  # EngineInfo as a dict, read from the running engine
    batch: list[torch.Tensor] | None = None  # per probe sample [T, P, H]
    repeats: list[list[torch.Tensor]] = field(default_factory=list)
    alone: dict[int, torch.Tensor] = field(default_factory=dict)  # probe index -> capture alone
    seconds: dict[str, float] = field(default_factory=dict)
    error: str | None = None  # the error's first line (the log has its traceback)
    failed_at: Step | None = None  # which step of probe_engine raised `error`
    ran_on: str | None = None  # host and process that started the engine (on a cluster: which node)

    # The request's fields, read through the capture by the analysis and the reports.
    label = property(lambda self: self.request.label)
    role = property(lambda self: self.request.role)
    spec = property(lambda self: self.request.spec)
    model_path = property(lambda self: self.request.model_path)
    points = property(lambda self: self.request.points)
    config = property(lambda self: self.request.config)
    labels = property(lambda self: self.request.labels)

    @property
    def start_failed(self) -> bool:
        return self.failed_at == Step.START

    @property
    def ok(self) -> bool:
        return self.error is None and self.batch is not None

    def point(self, label: str, which: str = "batch", indices: Sequence[int] | None = None) -> list[torch.Tensor]:
        """Per-sample [T, H] tensors of one point from the batch capture (or a repeat 'repeat<k>', or 'alone')."""
        j = self.labels.index(label)
        if which == "alone":
            return [self.alone[i][:, j] for i in sorted(self.alone)]
        source = self.batch if which == "batch" else self.repeats[int(which.removeprefix("repeat")) - 1]
        assert source is not None
        picked = range(len(source)) if indices is None else indices
        return [source[i][:, j] for i in picked]

    @property
    def dtype(self) -> str:
        return str((self.info or {}).get("dtype") or self.spec.dtype or "unknown")


def _checked(samples: Sequence[PreparedSample], captures: Sequence[Capture], points: list[Point],
             hidden_size: int, label: str) -> list[torch.Tensor]:
    if [c.sample_id for c in captures] != [s.sample_id for s in samples]:
        raise ProbeError(f"{label}: returned samples {[c.sample_id for c in captures]} for "
                         f"{[s.sample_id for s in samples]}")
    for s, c in zip(samples, captures):
        problem = check_capture(s, c, num_points=len(points), hidden_size=hidden_size)
        if problem is not None:
            raise ProbeError(f"{label}: sample {s.sample_id}: {problem}")
    return [c.hidden_states_TPH.detach() for c in captures]


def _capture(engine: Probeable, samples: Sequence[PreparedSample], batch_size: int, *, points: list[Point],
             hidden_size: int, label: str) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for i in range(0, len(samples), batch_size):
        chunk = list(samples[i: i + batch_size])
        out += _checked(chunk, engine.capture(chunk), points, hidden_size, label)
    return out


def capture_probe(request: ProbeRequest, engine: Probeable, samples: Sequence[PreparedSample], probe: ProbeConfig,
                  *, hidden_size: int) -> ProbeCapture:
    """Probe a started engine: the batch `probe.repeats` times, then `probe.alone` samples one by one. An error is
    returned in the capture (failed_at "probe"), beside what was captured before it."""
    kw = dict(points=request.points, hidden_size=hidden_size, label=request.label)
    batch_size = request.spec.batch_size
    got: dict[str, Any] = {"seconds": {}}  # the capture's fields, as far as the probe got
    try:
        t0 = time.perf_counter()
        got["info"] = dataclasses.asdict(engine.info())
        got["batch"] = _capture(engine, samples, batch_size, **kw)
        got["seconds"]["batch"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        got["repeats"] = [_capture(engine, samples, batch_size, **kw) for _ in range(probe.repeats - 1)]
        got["seconds"]["repeats"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        # Alone only means something when the batch held other samples.
        if len(samples) > 1:
            got["alone"] = {i: _capture(engine, [samples[i]], 1, **kw)[0] for i in range(probe.alone)}
        got["seconds"]["alone"] = time.perf_counter() - t0
    except Exception as e:  # recorded: the report names the engine and the error; the verdict fails
        got.update(error=first_line(e), failed_at=Step.PROBE)
        log.error("engine %s failed (probe): %s\n%s", request.label, got["error"], traceback.format_exc())
    return ProbeCapture(request=request, **got)


def probe_engine(request: ProbeRequest, samples: Sequence[PreparedSample], probe: ProbeConfig, *, num_layers: int,
                 hidden_size: int) -> ProbeCapture:
    """Make the request's engine, start it, probe it, close it. Errors are returned in the capture (with the step
    that raised them), not raised."""
    t0 = time.perf_counter()
    ran_on = f"{socket.gethostname()} pid {os.getpid()}"
    captured, seconds = ProbeCapture(request=request), {}
    step = Step.MAKE
    try:
        engine = request.make(num_layers, max_seq_len=max((s.num_tokens for s in samples), default=None))
        try:
            step = Step.START
            engine.start()
            seconds["start"] = time.perf_counter() - t0
            step = Step.PROBE
            captured = capture_probe(request, engine, samples, probe, hidden_size=hidden_size)
        finally:
            t1 = time.perf_counter()
            engine.close()
            seconds["close"] = time.perf_counter() - t1
    except Exception as e:  # recorded: the report names the engine and the error; the verdict fails
        captured = dataclasses.replace(captured, error=first_line(e), failed_at=step)
        log.error("engine %s failed (%s): %s\n%s", request.label, step, captured.error, traceback.format_exc())
    # In the order the steps ran: start, the probe's own parts, close, total.
    seconds = {**{k: v for k, v in seconds.items() if k == "start"}, **captured.seconds,
               **{k: v for k, v in seconds.items() if k == "close"}, "total": time.perf_counter() - t0}
    return dataclasses.replace(captured, seconds=seconds, ran_on=ran_on)
