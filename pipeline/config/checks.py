"""Config against the world, before any model loads: the model directory (built first for a tiny-model recipe) and
the data file. Each failure is a ConfigError naming the field and the value."""
from __future__ import annotations

from pathlib import Path

from pipeline.config.schema import ConfigError, ExtractConfig
from pipeline.data.remote_code import RemoteCodeError, check_remote_code
from pipeline.data.sources import check_readable
from pipeline.models.info import ModelInfo, read_model_info
from pipeline.models.tiny import ensure_model


def _model_dir(cfg: ExtractConfig) -> Path:
    if not cfg.model.build:
        return Path(cfg.model.path)
    path = Path(cfg.model.path) if cfg.model.path else None
    if path is not None and path.name != cfg.model.build:
        raise ConfigError(f"model.path={cfg.model.path!r}: a built model lives in a directory named after its recipe "
                          f"{cfg.model.build!r}")
    return ensure_model(cfg.model.build, path.parent if path is not None else None)  # cached after the first build


def resolve_model(cfg: ExtractConfig) -> ModelInfo:
    """The model's facts (built first when it is a tiny-model recipe); errors name model.path, and
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


