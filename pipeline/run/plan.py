"""A run's plan, made from the prepared data before any engine starts or any weight is read: what the run will write
and whether out_dir's file system holds it, and the engines it will start with their TP sizes and the memory their
weights take per GPU. `plan=true` prints it and stops; otherwise a run that cannot fit is refused (exit 2) unless
`check_space=false`: a full disk after days is the most expensive way to learn it."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from pipeline.config import ConfigError
from pipeline.config.entries import parse_entries, parse_entry, to_spec
from pipeline.core.contracts import EngineSpec, PreparedSample
from pipeline.models.memory import WeightSize, weight_size
from pipeline.run.resolve import ResolvedRun
from pipeline.shards import capacity
from pipeline.shards.capacity import Capacity, gib
from pipeline.core.store_dir import opened
from pipeline.shards.layout import HIDDEN_DTYPES, SHARDS_DIR, shard_paths
from pipeline.shards.writer import relative
from pipeline.shards.plan import plan_units


@dataclass(frozen=True)
class EnginePlan:
    label: str
    role: str
    tp_size: int
    weights: WeightSize

    def line(self) -> str:
        per_gpu = self.weights.bytes / self.tp_size
        return (f"engine {self.label} ({self.role}), TP {self.tp_size}: weights {gib(self.weights.bytes)} "
                f"({self.weights.how}), {gib(int(per_gpu))} per GPU before the KV cache and activations")


@dataclass(frozen=True)
class RunPlan:
    out_dir: Path  # the run directory, or for a run on object storage its local spool
    points: list[str]
    hidden_size: int
    stored_dtype: str
    capacity: Capacity
    engines: list[EnginePlan]
    out_url: str | None = None  # the run on object storage

    def lines(self) -> list[str]:
        c = self.capacity
        free = "unknown" if c.free_bytes is None else gib(c.free_bytes)
        verdict = "fits" if c.fits else "does NOT fit"
        room = f"its file system has {free} free: {verdict}" if self.out_url is None else \
            (f"no size limit is checked on object storage; the spool {self.out_dir} holds the units in flight, at "
             f"most about {gib(c.bytes_needed)}, and its file system has {free} free: {verdict}")
        return [f"plan for {self.out_url or self.out_dir}: {c.samples} samples, {c.tokens} tokens in {c.shards} "
                f"shard(s); {c.shards_left} shard(s), {c.tokens_left} tokens left to write",
                f"states: {len(self.points)} points ({', '.join(self.points)}) x {self.hidden_size} x "
                f"{self.stored_dtype} = {c.state_bytes_per_token} bytes per token; about {gib(c.bytes_total)} "
                f"{'on disk' if self.out_url is None else 'in the bucket'} in all, {gib(c.bytes_left)} left to "
                f"write; {room}",
                *[e.line() for e in self.engines],
                "nothing was started and no weight was read: run it without plan=true"]


def _capture_dtype(run: ResolvedRun) -> str:
    """The dtype the primary engine captures in: engine.dtype, or the checkpoint's own for `auto`."""
    dtype = str(run.cfg.engine.dtype)
    return dtype if dtype != "auto" else run.model.torch_dtype


def make_plan(run: ResolvedRun, samples: Sequence[PreparedSample]) -> RunPlan:
    """The plan; the engines' weights are sized only when it is printed (plan=true): the space check needs none."""
    cfg = run.cfg
    capture = _capture_dtype(run)
    capture = capture if capture in HIDDEN_DTYPES else "float32"
    per_token = capacity.state_bytes_per_token(len(run.points), run.model.hidden_size, capture,
                                               cfg.runner.storage_dtype)
    units = plan_units(samples, max_tokens_per_shard=cfg.runner.max_tokens_per_shard,
                       max_samples_per_shard=cfg.runner.max_samples_per_shard)
    cap = capacity.plan([[s.num_tokens for s in u] for u in units], run.out_dir, per_token=per_token,
                        replacing=cfg.overwrite, **_on_store(run))
    return RunPlan(out_dir=run.out_dir, points=[p.label for p in run.points], hidden_size=run.model.hidden_size,
                   stored_dtype=cfg.runner.storage_dtype or capture, capacity=cap,
                   engines=_engines(run) if cfg.plan else [], out_url=run.out_url)


def _on_store(run: ResolvedRun) -> dict[str, Any]:
    """For a run on object storage: the units its store finished (one listing of the markers) and how many units
    this node's spool holds at once (each replica's, two with overlapped writes)."""
    if run.out_url is None:
        return {}
    runner = run.cfg.runner
    done = {o.key for o in opened(run.out_url, run.cfg.s3_endpoint).list(f"{SHARDS_DIR}/")}
    writers = (runner.num_replicas if runner.name == "ray" else 1) * (2 if runner.overlap_writes else 1)
    return {"finished": lambda i: relative(run.out_dir, shard_paths(run.out_dir, i)["marker"]) in done,
            "writers": writers}


def _engines(run: ResolvedRun) -> list[EnginePlan]:
    cfg, sizes = run.cfg, {}

    def plan(spec: EngineSpec, label: str, role: str, model_path: str | None = None) -> EnginePlan:
        path = Path(model_path or run.model.path)
        if path not in sizes:
            sizes[path] = weight_size(path)
        return EnginePlan(label, role, spec.tp_size, sizes[path])

    engines = [plan(cfg.engine, f"{cfg.engine.name}@{_capture_dtype(run)}", "captures the run")]
    if str(cfg.gate.mode) != "off":
        reference = parse_entry(cfg.diff.reference, "diff.reference")
        engines.append(plan(to_spec(reference), reference.display, "the gate's reference", reference.model_path))
        for entry in parse_entries(cfg.gate.engines, "gate.engines"):
            engines.append(plan(to_spec(entry), entry.display, "compared by the gate", entry.model_path))
    return engines


def check_space(plan: RunPlan) -> None:
    c = plan.capacity
    if c.fits:
        return
    if plan.out_url is not None:
        raise ConfigError(
            f"spool_dir: {plan.out_dir} (where the units of {plan.out_url} are written before they are uploaded) "
            f"needs about {gib(c.bytes_needed)} for the units in flight and its file system has "
            f"{gib(c.free_bytes or 0)} free; choose another spool_dir, smaller units (runner.max_tokens_per_shard), "
            "or pass check_space=false")
    raise ConfigError(
        f"out_dir={str(plan.out_dir)!r}: the run needs about {gib(c.bytes_left)} ({c.tokens_left} tokens x "
        f"{c.state_bytes_per_token} bytes of states, {c.shards_left} shards) and its file system has "
        f"{gib(c.free_bytes or 0)} free; shrink it (runner.storage_dtype=float8_e4m3fn, fewer capture.points, a "
        "smaller data.max_length or data.limit), free space, or pass check_space=false")
