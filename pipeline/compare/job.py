"""`python -m pipeline.diff` as a job (its config: DiffJobConfig, conf/diff.yaml): checked as extract is checked
(pipeline.compare.preflight), engines probed one after another (each started, probed, closed), then compared
(pipeline.compare.comparison) and reported."""
from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from pipeline.compare.analyze import DiffResult, all_points
from pipeline.compare.comparison import compare, report_config
from pipeline.compare.lineup import comparison
from pipeline.compare.preflight import Lineup, preflight
from pipeline.compare.probe import probe_engine, probe_samples
from pipeline.compare.report import write_report
from pipeline.config import ConfigError, DiffJobConfig, ProbeConfig, to_config
from pipeline.config.checks import check_points_named
from pipeline.config.location import checked_locations
from pipeline.core.contracts import PreparedSample
from pipeline.data.load import load_samples
from pipeline.data.remote_code import RemoteCodeError, load_tokenizer
from pipeline.models.info import ModelInfo
from pipeline.points import Point, PointError, resolve

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class DiffOutcome:
    """What the diff job found, where its report is, and how long it took."""

    result: DiffResult
    report_dir: Path
    seconds: float


def diff_points(cfg: DiffJobConfig, model: ModelInfo) -> list[Point]:
    """What the compared engines capture (`diff.points`); the reference always captures every point."""
    value = cfg.diff.points
    if value == "all":
        return all_points(model.num_layers)
    values, field_name = (cfg.capture.points, "capture.points") if value == "capture" else (value, "diff.points")
    check_points_named(list(values), field_name, model)
    try:
        return resolve(list(values), convention=cfg.capture.convention, family=model.family,
                       num_layers=model.num_layers)
    except PointError as e:
        raise ConfigError(f"{field_name}={list(values)!r}: {e}") from e


def probe_data(cfg: DiffJobConfig, model: ModelInfo, probe: ProbeConfig) -> tuple[list[PreparedSample], str | None]:
    """The probe samples, and who wrote their answers when data.path is a regeneration directory."""
    try:
        tokenizer = load_tokenizer(model.path, cfg.model.trust_remote_code)
    except RemoteCodeError as e:  # declared code the setting keeps from running, and no built-in class reads it
        raise ConfigError(str(e)) from e
    data = load_samples(cfg.data.path, tokenizer, cfg.data, limit=probe.num_samples, vocab_size=model.vocab_size,
                        error=ConfigError)
    answers = None
    if data.regeneration:
        a = data.regeneration["engine"]
        answers = f"{a['framework']} {a['framework_version']} ({a['dtype']}), regeneration {data.source}"
    return probe_samples(data.samples, probe), answers


def run_diff(dcfg: DictConfig) -> DiffOutcome:
    started = time.perf_counter()
    cfg = to_config(dcfg, DiffJobConfig)
    cfg = checked_locations(cfg, None)  # data.path on object storage: read from its local copy from here on
    checked = preflight(model=cfg.model, data=cfg.data, out_dir=cfg.out_dir, run=False,
                        lineup=Lineup(reference=cfg.diff.reference, others=cfg.diff.engines, where="diff.engines"))
    model, out_dir = checked.model, checked.out_dir
    requests = comparison(cfg.diff.reference, cfg.diff.engines, "diff.engines", model=model,
                          all_points=all_points(model.num_layers), points=diff_points(cfg, model),
                          trust_remote_code=cfg.model.trust_remote_code)  # config errors first
    samples, answers = probe_data(cfg, model, cfg.diff.probe)
    runs = []
    for request in requests:
        log.info("probing %s (%s) with %d samples, %d tokens", request.label, request.role, len(samples),
                 sum(s.num_tokens for s in samples))
        runs.append(probe_engine(request, samples, cfg.diff.probe, num_layers=model.num_layers,
                                 hidden_size=model.hidden_size))
    result = compare(runs, reference=runs[0].label, model=model, samples=samples, cfg=cfg.diff,
                     storage_dtype=cfg.storage_dtype)
    if answers:  # the report says who wrote the probe's answers beside who computes its features
        result = dataclasses.replace(result, probe={**result.probe, "answers_by": answers})
    t0 = time.perf_counter()
    result = dataclasses.replace(result, seconds={**result.seconds,
                                                  "engines": sum(r.seconds.get("total", 0.0) for r in runs)})
    write_report(result, out_dir, config=report_config(cfg.diff, command="pipeline.diff"), html=cfg.diff.html)
    result = dataclasses.replace(result, seconds={**result.seconds, "report": time.perf_counter() - t0})
    return DiffOutcome(result=result, report_dir=out_dir, seconds=time.perf_counter() - started)
