"""The diff as a stage: engines probed one after another (each started, probed, closed), then analysed and reported.

`run_diff` is what `python -m pipeline.diff` runs; `compare` is shared with the extract gate (pipeline.compare.gate).
"""
from __future__ import annotations

import dataclasses
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from omegaconf import DictConfig

from pipeline.compare.analyze import Analysis, DiffResult, all_points
from pipeline.compare.checkpoint import Checkpoint
from pipeline.compare.entries import EngineEntry, engine_specs, entry, reference_spec
from pipeline.compare.probe import EngineRun, probe_engine, probe_samples
from pipeline.compare.report import write_report
from pipeline.config import ConfigError, DiffConfig, ExtractConfig, ProbeConfig, to_config
from pipeline.data.prepare import prepare
from pipeline.data.sample import PreparedSample
from pipeline.models.info import ModelInfo
from pipeline.points import Point, PointError, resolve
from pipeline.run.resolve import check_data_path, resolve_model

log = logging.getLogger(__name__)
_SMALL_ANALYSIS = 1 << 25  # values of the reference capture (tokens x points x hidden) below which one thread is faster


@dataclass(frozen=True, kw_only=True)
class DiffOutcome:
    result: DiffResult
    report_dir: Path
    seconds: float


def diff_points(cfg: ExtractConfig, model: ModelInfo) -> list[Point]:
    """What the compared engines capture (`diff.points`); the reference always captures every point."""
    value = cfg.diff.points
    if value == "all":
        return all_points(model.num_layers)
    values, field_name = (cfg.capture.points, "capture.points") if value == "capture" else (value, "diff.points")
    try:
        return resolve(list(values), convention=cfg.capture.convention, family=model.family,
                       num_layers=model.num_layers)
    except PointError as e:
        raise ConfigError(f"{field_name}={list(values)!r}: {e}") from e


def engine_entries(cfg: ExtractConfig, model: ModelInfo) -> list[EngineEntry]:
    ref = reference_spec(cfg.diff.reference)
    points = diff_points(cfg, model)
    entries = [entry(ref, role="reference", model=model, points=all_points(model.num_layers), where="diff.reference")]
    for i, spec in enumerate(engine_specs(cfg.diff.engines, "diff.engines", ref)):
        entries.append(entry(spec, role="engine", model=model, points=points, where=f"diff.engines[{i}]"))
    return entries


def probe_data(cfg: ExtractConfig, model: ModelInfo, probe: ProbeConfig) -> list[PreparedSample]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model.path))
    data = prepare(cfg.data.path, tokenizer, max_length=cfg.data.max_length, length_policy=cfg.data.length_policy,
                   limit=probe.num_samples)
    return probe_samples(data.samples, probe)


@contextmanager
def _threads_for(num_values: int):
    """Small probes are analysed on one thread: on a busy CPU, OpenMP's spinning threads make many small tensor
    ops 10-50x slower (measured: 5-7 s vs 0.1-0.7 s for the tiny model's gate)."""
    before = torch.get_num_threads()
    if num_values < _SMALL_ANALYSIS:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def compare(runs: Sequence[EngineRun], *, reference: str, model: ModelInfo, samples: Sequence[PreparedSample],
            cfg: DiffConfig) -> DiffResult:
    """Analyse finished runs against the reference (checkpoint anchors and logits from the model's own files)."""
    t0 = time.perf_counter()
    ckpt = Checkpoint(model.path)
    size = sum(s.num_tokens for s in samples) * (model.num_layers + 2) * model.hidden_size
    with _threads_for(size):
        result = Analysis(runs, reference, ckpt=ckpt, cfg=cfg, num_layers=model.num_layers, samples=samples).run()
    result.model = {"path": str(model.path), "model_type": model.model_type, "architecture": model.architecture,
                    "num_layers": model.num_layers, "hidden_size": model.hidden_size,
                    "moe_layers": sorted(ckpt.moe_layers),
                    "quantization": (model.quantization or {}).get("quant_method")}
    result.probe = {"num_samples": len(samples), "num_tokens": sum(s.num_tokens for s in samples),
                    "samples": [{"sample_id": s.sample_id, "source": s.source, "row": s.row,
                                 "num_tokens": s.num_tokens, "truncated": s.truncated} for s in samples]}
    result.seconds["analysis"] = time.perf_counter() - t0
    return result


def report_config(cfg: DiffConfig, **extra: Any) -> dict[str, Any]:
    return {**dataclasses.asdict(cfg), **extra}


def run_diff(dcfg: DictConfig) -> DiffOutcome:
    started = time.perf_counter()
    cfg = to_config(dcfg)
    check_data_path(cfg)
    model = resolve_model(cfg)
    entries = engine_entries(cfg, model)  # every config error surfaces here, before any engine starts
    out_dir = Path(cfg.out_dir)
    samples = probe_data(cfg, model, cfg.diff.probe)
    runs = []
    for e in entries:
        log.info("probing %s (%s) with %d samples, %d tokens", e.label, e.role, len(samples),
                 sum(s.num_tokens for s in samples))
        run = EngineRun(label=e.label, role=e.role, config=e.describe(), points=e.points)
        runs.append(probe_engine(run, lambda e=e: e.make(model.num_layers), samples, cfg.diff.probe,
                                 batch_size=e.config.batch_size, hidden_size=model.hidden_size))
    result = compare(runs, reference=entries[0].label, model=model, samples=samples, cfg=cfg.diff)
    t0 = time.perf_counter()
    result.seconds["engines"] = sum(r.seconds.get("total", 0.0) for r in runs)
    write_report(result, out_dir, config=report_config(cfg.diff, command="pipeline.diff"), html=cfg.diff.html)
    result.seconds["report"] = time.perf_counter() - t0
    return DiffOutcome(result=result, report_dir=out_dir, seconds=time.perf_counter() - started)
