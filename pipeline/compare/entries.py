"""Engine entries resolved against their presets and the model: ready to make, start, probe and close.

Every engine is made through `make_engine(name, ...)`, so an adapter that lands later (or one a test registers)
is compared by naming it; an adapter in its own virtualenv runs in a worker through the same call.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from pipeline.compare.spec import EngineSpec, SpecError, parse_spec, parse_specs, preset, unique
from pipeline.config import ConfigError, EngineConfig
from pipeline.engines.base import Engine, engine_class, engine_names, make_engine
from pipeline.models.info import ModelInfo, read_model_info
from pipeline.points import Point

_ENGINE_FIELDS = {f.name for f in dataclasses.fields(EngineConfig)}


@dataclass(kw_only=True)
class EngineEntry:
    label: str
    role: str  # reference | primary | engine
    config: EngineConfig
    model_path: str
    points: list[Point]

    def describe(self) -> dict[str, Any]:
        return {"name": self.config.name, "dtype": self.config.dtype, "batch_size": self.config.batch_size,
                "tp_size": self.config.tp_size, "options": self.config.options, "model_path": self.model_path}

    def make(self, num_layers: int) -> Engine:
        cfg = self.config
        return make_engine(cfg.name, model_path=self.model_path, dtype=cfg.dtype, points=self.points,
                           num_layers=num_layers, options={**cfg.options, "tp_size": cfg.tp_size})


def engine_config(spec: EngineSpec, where: str) -> EngineConfig:
    """The preset of `spec.name` (conf/engine/<name>.yaml) with the entry's own values over it."""
    base = {k: v for k, v in preset(spec.name).items() if k in _ENGINE_FIELDS}
    base["name"] = spec.name
    base["options"] = {**(base.get("options") or {}), **spec.options}
    for key in ("dtype", "batch_size", "tp_size"):
        if getattr(spec, key) is not None:
            base[key] = getattr(spec, key)
    try:
        return EngineConfig(**base)
    except ValueError as e:
        raise ConfigError(f"{where} ({spec.display}): {e}") from e


def _model_path(spec: EngineSpec, model: ModelInfo, where: str) -> str:
    if spec.model_path is None:
        return str(model.path)
    try:
        other = read_model_info(spec.model_path)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{where} ({spec.display}): model_path={spec.model_path!r}: {e}") from e
    if (other.num_layers, other.hidden_size) != (model.num_layers, model.hidden_size):
        raise ConfigError(f"{where} ({spec.display}): model_path={spec.model_path!r} has {other.num_layers} layers "
                          f"and hidden size {other.hidden_size}; the model has {model.num_layers} and "
                          f"{model.hidden_size}: it is not the same model")
    return str(Path(spec.model_path))


def _check_name(spec: EngineSpec, where: str) -> None:
    if spec.name not in engine_names():
        raise ConfigError(f"{where}: engine={spec.name!r} is unknown; known engines: {', '.join(engine_names())}")
    try:
        engine_class(spec.name)
    except NotImplementedError as e:
        raise ConfigError(f"{where}: {e}") from e


def entry(spec: EngineSpec, *, role: str, model: ModelInfo, points: Sequence[Point], where: str) -> EngineEntry:
    _check_name(spec, where)
    return EngineEntry(label=spec.display, role=role, config=engine_config(spec, where),
                       model_path=_model_path(spec, model, where), points=list(points))


def reference_spec(value: Any) -> EngineSpec:
    try:
        return parse_spec(value, "diff.reference")
    except SpecError as e:
        raise ConfigError(str(e)) from e


def engine_specs(values: Any, where: str, reference: EngineSpec) -> list[EngineSpec]:
    """The entries other than the reference (an entry identical to the reference is the reference)."""
    try:
        specs = unique([reference, *parse_specs(values, where)])
    except SpecError as e:
        raise ConfigError(str(e)) from e
    return specs[1:]
