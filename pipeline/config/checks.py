"""Config against the world, before any model loads: the model directory (for a tiny-model recipe: where the job's
build step put it; nothing is built here) and the data file. Each failure is a ConfigError naming the field and the
value."""
from __future__ import annotations

from pathlib import Path

from pipeline.config.schema import ConfigError, ExtractConfig
from pipeline.data.remote_code import RemoteCodeError, check_remote_code
from pipeline.data.sources import check_readable
from pipeline.models.built import built_model_dir
from pipeline.models.info import ModelInfo, read_model_info


def _model_dir(cfg: ExtractConfig) -> Path:
    if not cfg.model.build:
        return Path(cfg.model.path)
    return built_model_dir(cfg.model.build, cfg.model.path)


def resolve_model(cfg: ExtractConfig) -> ModelInfo:
    """The model's facts; errors name model.path, and
    model.trust_remote_code when the checkpoint needs its own code to load and the setting is off."""
    try:
        info = read_model_info(_model_dir(cfg))
        check_remote_code(info.path, cfg.model.trust_remote_code)
    except RemoteCodeError as e:
        raise ConfigError(str(e)) from e
    except (OSError, ValueError) as e:
        raise ConfigError(str(e) if "model.path" in str(e) else f"model.path={cfg.model.path!r}: {e}") from e
    return info


def check_data_path(cfg: ExtractConfig) -> None:
    try:
        check_readable(cfg.data.path)
    except (OSError, ValueError) as e:
        raise ConfigError(f"data.path={cfg.data.path!r}: {e}") from e


