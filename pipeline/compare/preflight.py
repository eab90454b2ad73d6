"""What every job checks before any model loads, in one order: the engines' names and options, the output directory,
the data file, the model. extract (`pipeline.run.resolve`) and diff (`pipeline.compare.job`) both run `preflight`;
each failure is a ConfigError naming the field and the value.

It lives here, not in `pipeline.config`, because it reads the engines' registry and what a run directory holds
(`pipeline.shards`), both above the config layer; `pipeline.run` sits above this layer and uses it as it is.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.compare.lineup import check_entries
from pipeline.config import ConfigError, DataConfig, ModelConfig
from pipeline.config.checks import check_data_path, resolve_model
from pipeline.core.contracts import EngineSpec
from pipeline.core.storage import SCHEME
from pipeline.engines.registry import check_name, check_options
from pipeline.models.info import ModelInfo
from pipeline.shards.layout import check_out
from pipeline.shards.manifest import is_finished


@dataclass(frozen=True, kw_only=True)
class Lineup:
    """The engines a job starts: extract's primary (None for the diff), the reference and the others, where `where`
    is the config key of the others (`diff.engines`, `gate.engines`)."""

    primary: EngineSpec | None = None
    reference: Any
    others: Any
    where: str


@dataclass(frozen=True, kw_only=True)
class Checked:
    out_dir: Path
    model: ModelInfo


def check_engines(lineup: Lineup) -> None:
    """Every engine's name and options (also the gate's with gate.mode=off: a misspelled option is not left for the
    day the gate is turned on); nothing starts, and no built-in engine's adapter is imported."""
    if lineup.primary is not None:
        try:
            check_name(lineup.primary.name)
            check_options(lineup.primary, "engine")
        except ValueError as e:  # OptionsError included
            raise ConfigError(str(e)) from e
    check_entries(lineup.reference, lineup.others, lineup.where)


def check_out_dir(out_dir: str, *, run: bool, overwrite: bool = False) -> Path:
    """`out_dir` as a run directory (`run`: extract's own, resumed when unfinished, replaced only with `overwrite`) or
    as a report directory (the diff's: never a run directory nor inside one)."""
    out = check_out(Path(out_dir), f"out_dir={out_dir!r}", ConfigError, itself=not run,
                    note="" if run else " (a run's own gate report is in its diff/)")
    if run and out.is_dir() and is_finished(out) and not overwrite:  # before the model is hashed or the gate runs
        raise ConfigError(f"out_dir={out_dir!r} holds a finished run (manifest.json); choose another out_dir, "
                          f"or pass overwrite=true to replace it")
    return out


def preflight(*, model: ModelConfig, data: DataConfig, out_dir: str, lineup: Lineup, run: bool,
              overwrite: bool = False) -> Checked:
    """The engines first (before the model is read), then out_dir, the data file and the model's facts."""
    check_engines(lineup)
    # a run on object storage: its prefix is checked where it is claimed (pipeline.core.store_dir); its spool is local
    out = Path(out_dir) if run and SCHEME.match(out_dir) else check_out_dir(out_dir, run=run, overwrite=overwrite)
    check_data_path(data)
    return Checked(out_dir=out, model=resolve_model(model))
