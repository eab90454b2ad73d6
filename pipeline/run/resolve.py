"""Check a config against the world before any model loads: engine, model, points, data, output directory.

Each failure names the config field and the value. The result is everything later stages need, resolved once.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from pipeline.compare.lineup import check_entries
from pipeline.config import ConfigError, ExtractConfig
from pipeline.config.checks import check_data_path, resolve_model
from pipeline.engines.registry import check_name, check_options
from pipeline.models.info import ModelInfo
from pipeline.points import Point, PointError, resolve
from pipeline.shards.layout import run_conflict
from pipeline.shards.manifest import is_finished


@dataclass(frozen=True, kw_only=True)
class ResolvedRun:
    cfg: ExtractConfig
    model: ModelInfo
    points: list[Point]
    data_path: Path
    out_dir: Path


def _check_engines(cfg: ExtractConfig) -> None:
    """The primary and the gate's engines (also with diff.gate=off: a misspelled option is not left for the day the
    gate is turned on); nothing starts, and no built-in engine's adapter is imported."""
    try:
        check_name(cfg.engine.name)
        check_options(cfg.engine, "engine")
    except ValueError as e:  # OptionsError included
        raise ConfigError(str(e)) from e
    check_entries(cfg.diff.reference, cfg.diff.gate_engines, "diff.gate_engines")


def _check_out_dir(cfg: ExtractConfig) -> Path:
    out = Path(cfg.out_dir)
    if (why := run_conflict(out)) is not None:
        raise ConfigError(f"out_dir={cfg.out_dir!r} {why}")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"out_dir={cfg.out_dir!r} exists and is not a directory")
    if out.exists() and is_finished(out) and not cfg.overwrite:
        raise ConfigError(f"out_dir={cfg.out_dir!r} holds a finished run (manifest.json); choose another out_dir, "
                          f"or pass overwrite=true to replace it")
    probe = out if out.exists() else next(p for p in out.parents if p.exists())
    if not probe.is_dir():
        raise ConfigError(f"out_dir={cfg.out_dir!r} cannot be created: {probe} is a file")
    try:  # a real write: permission bits alone say nothing for root or on read-only mounts
        tempfile.TemporaryFile(dir=probe).close()
    except OSError as e:
        raise ConfigError(f"out_dir={cfg.out_dir!r} is not writable ({probe}: {e.strerror})") from e
    return out


def resolve_run(cfg: ExtractConfig) -> ResolvedRun:
    _check_engines(cfg)
    out_dir = _check_out_dir(cfg)
    check_data_path(cfg)
    model = resolve_model(cfg)
    try:
        points = resolve(cfg.capture.points, convention=cfg.capture.convention, family=model.family,
                         num_layers=model.num_layers)
    except PointError as e:
        raise ConfigError(f"capture.points={list(cfg.capture.points)!r} ({cfg.capture.convention} ids): {e}") from e
    return ResolvedRun(cfg=cfg, model=model, points=points, data_path=Path(cfg.data.path), out_dir=out_dir)
