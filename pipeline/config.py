"""Typed configuration: one dataclass per plug point, registered in Hydra's ConfigStore as the schema of conf/.

Field-level checks live in `__post_init__` (they run when OmegaConf turns the composed config into objects) and name
the field and the value. Checks that need the outside world (model files, data files, the output directory) live in
`pipeline.run.resolve`, which runs before any model loads.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from pipeline.points import FRAMEWORKS

DTYPES = ("auto", "float32", "bfloat16", "float16")
STORAGE_DTYPES = ("float8_e4m3fn",)
LENGTH_POLICIES = ("truncate", "reject")


class ConfigError(ValueError):
    """A configuration that cannot run; raised before any model is loaded, naming the field and the value."""


def _require(ok: bool, field_name: str, value: Any, why: str) -> None:
    if not ok:
        raise ValueError(f"{field_name}={value!r}: {why}")


@dataclass(kw_only=True)
class ModelConfig:
    name: str = MISSING
    path: Optional[str] = None  # a local checkpoint directory
    build: Optional[str] = None  # a tiny-model recipe: `path` is built locally when it is missing
    points: list[Any] = field(default_factory=list)  # the capture points recommended for this target

    def __post_init__(self) -> None:
        _require(self.path is not None or self.build is not None, "model.path", self.path,
                 "a model checkpoint directory is required (pass model.path=/path/to/checkpoint)")


@dataclass(kw_only=True)
class EngineConfig:
    name: str = MISSING
    dtype: str = "auto"  # compute dtype; "auto" = the checkpoint's dtype
    batch_size: int = 8
    tp_size: int = 1
    options: dict[str, Any] = field(default_factory=dict)  # engine-specific, passed to the adapter as is

    def __post_init__(self) -> None:
        _require(self.dtype in DTYPES, "engine.dtype", self.dtype, f"must be one of {DTYPES}")
        _require(self.batch_size >= 1, "engine.batch_size", self.batch_size, "must be >= 1")
        _require(self.tp_size >= 1, "engine.tp_size", self.tp_size, "must be >= 1")


@dataclass(kw_only=True)
class DataConfig:
    path: str = MISSING  # JSONL or Parquet of conversations
    max_length: int = 2048
    length_policy: str = "truncate"
    limit: Optional[int] = None  # first N records only

    def __post_init__(self) -> None:
        _require(self.max_length >= 2, "data.max_length", self.max_length, "must be >= 2")
        _require(self.length_policy in LENGTH_POLICIES, "data.length_policy", self.length_policy,
                 f"must be one of {LENGTH_POLICIES}")
        _require(self.limit is None or self.limit >= 1, "data.limit", self.limit, "must be >= 1 or null")


@dataclass(kw_only=True)
class RunnerConfig:
    name: str = "local"
    max_tokens_per_shard: int = 65536  # bounds the writer's memory: one shard is held at a time
    max_samples_per_shard: int = 1024
    storage_dtype: Optional[str] = None  # None = the engine's compute dtype

    def __post_init__(self) -> None:
        _require(self.name == "local", "runner.name", self.name, "only the local runner exists so far")
        _require(self.max_tokens_per_shard >= 1, "runner.max_tokens_per_shard", self.max_tokens_per_shard,
                 "must be >= 1")
        _require(self.max_samples_per_shard >= 1, "runner.max_samples_per_shard", self.max_samples_per_shard,
                 "must be >= 1")
        _require(self.storage_dtype is None or self.storage_dtype in STORAGE_DTYPES, "runner.storage_dtype",
                 self.storage_dtype, f"must be null or one of {STORAGE_DTYPES}")


@dataclass(kw_only=True)
class CaptureConfig:
    points: list[Any] = field(default_factory=list)
    convention: str = "canonical"  # or a framework whose native ids `points` are written in

    def __post_init__(self) -> None:
        _require(self.convention in FRAMEWORKS, "capture.convention", self.convention,
                 f"must be one of {FRAMEWORKS}")


@dataclass(kw_only=True)
class ExtractConfig:
    model: ModelConfig = MISSING
    engine: EngineConfig = MISSING
    data: DataConfig = MISSING
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    capture: CaptureConfig = field(default_factory=CaptureConfig)
    out_dir: str = MISSING
    overwrite: bool = False  # replace a finished run directory (never done silently)


def _package_data(relative: str) -> str:
    return str(Path(__file__).resolve().parent / "data" / relative)


def _tiny_model_dir(name: str) -> str:
    from pipeline.models.tiny import default_root

    return str(default_root() / name)


def register_configs() -> None:
    """Schema + resolvers: `${pipeline_data:...}` (files shipped in the package, e.g. the bundled data) and
    `${tiny_model:NAME}` (where the tiny local models are built: $PIPELINE_MODELS_DIR or <repo>/.cache/models)."""
    ConfigStore.instance().store(name="extract_schema", node=ExtractConfig)
    OmegaConf.register_new_resolver("pipeline_data", _package_data, replace=True)
    OmegaConf.register_new_resolver("tiny_model", _tiny_model_dir, replace=True)


def to_config(cfg: DictConfig) -> ExtractConfig:
    """The composed Hydra config as validated objects; a missing required value names its key."""
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(f"required config value(s) missing: {', '.join(missing)} (pass them as overrides, "
                         f"e.g. {missing[0]}=...)")
    try:
        obj = OmegaConf.to_object(cfg)
    except ValueError as e:  # a __post_init__ check, possibly wrapped by OmegaConf with its own context
        raise ConfigError(str(e)) from e
    assert isinstance(obj, ExtractConfig)
    return obj


def resolved_dict(cfg: DictConfig) -> dict[str, Any]:
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
