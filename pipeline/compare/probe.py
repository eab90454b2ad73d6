"""The probe: a few prepared samples, run through one engine as a batch (repeated) and one by one.

`ProbeRun` is one engine of a comparison (its spec, checkpoint and points) and what it returned: the batch capture (per sample `[T, P, H]` in the engine's dtype), its
repeats (run-to-run determinism), captures of some samples alone (batch-composition dependence), what the engine
reports it ran, and timings. An engine that fails is recorded with its error, so a multi-engine report still shows
the others.
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


@dataclass(kw_only=True)
class ProbeRun:
    label: str
    role: str  # reference | primary | engine
    spec: EngineSpec
    model_path: str
    points: list[Point]
    trust_remote_code: bool = False  # model.trust_remote_code
    info: dict[str, Any] | None = None  # EngineInfo as a dict, read from the running engine
    batch: list[torch.Tensor] | None = None  # per probe sample [T, P, H]
    repeats: list[list[torch.Tensor]] = field(default_factory=list)
    alone: dict[int, torch.Tensor] = field(default_factory=dict)  # probe index -> capture alone
    seconds: dict[str, float] = field(default_factory=dict)
    error: str | None = None  # the error's first line (the log has its traceback)
    failed_at: str | None = None  # make | start | probe: which step of probe_engine raised `error`
    ran_on: str | None = None  # host and process that started the engine (on a cluster: which node)

    @property
    def config(self) -> dict[str, Any]:
        """The engine as resolved, for reports."""
        return {**self.spec.describe(), "model_path": self.model_path}

    def make(self, num_layers: int, max_seq_len: int | None = None) -> Engine:
        return make_engine(self.spec, model_path=self.model_path, points=self.points, num_layers=num_layers,
                           trust_remote_code=self.trust_remote_code, max_seq_len=max_seq_len)

    @property
    def start_failed(self) -> bool:
        return self.failed_at == "start"

    @property
    def ok(self) -> bool:
        return self.error is None and self.batch is not None

    @property
    def labels(self) -> list[str]:
        return [p.label for p in self.points]

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


def capture_probe(run: ProbeRun, engine: Probeable, samples: Sequence[PreparedSample], probe: ProbeConfig, *,
                  hidden_size: int) -> None:
    """Fill `run` from a started engine: the batch `probe.repeats` times, then `probe.alone` samples one by one."""
    kw = dict(points=run.points, hidden_size=hidden_size, label=run.label)
    batch_size = run.spec.batch_size
    t0 = time.perf_counter()
    run.info = dataclasses.asdict(engine.info())
    run.batch = _capture(engine, samples, batch_size, **kw)
    run.seconds["batch"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    run.repeats = [_capture(engine, samples, batch_size, **kw) for _ in range(probe.repeats - 1)]
    run.seconds["repeats"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    # Alone only means something when the batch held other samples.
    if len(samples) > 1:
        run.alone = {i: _capture(engine, [samples[i]], 1, **kw)[0] for i in range(probe.alone)}
    run.seconds["alone"] = time.perf_counter() - t0


def probe_engine(run: ProbeRun, samples: Sequence[PreparedSample], probe: ProbeConfig, *, num_layers: int,
                 hidden_size: int) -> ProbeRun:
    """Make the run's engine, start it, probe it, close it. Errors are recorded in the run (with the step that
    raised them), not raised."""
    t0 = time.perf_counter()
    run.ran_on = f"{socket.gethostname()} pid {os.getpid()}"
    step = "make"
    try:
        engine = run.make(num_layers, max_seq_len=max((s.num_tokens for s in samples), default=None))
        try:
            step = "start"
            engine.start()
            run.seconds["start"] = time.perf_counter() - t0
            step = "probe"
            capture_probe(run, engine, samples, probe, hidden_size=hidden_size)
        finally:
            t1 = time.perf_counter()
            engine.close()
            run.seconds["close"] = time.perf_counter() - t1
    except Exception as e:  # recorded: the report names the engine and the error; the verdict fails
        run.error, run.failed_at = first_line(e), step
        log.error("engine %s failed (%s): %s\n%s", run.label, step, run.error, traceback.format_exc())
    run.seconds["total"] = time.perf_counter() - t0
    return run
