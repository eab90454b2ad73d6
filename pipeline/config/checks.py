"""Config against the world, before any model loads: the model directory (for a tiny-model recipe: where the job's
build step put it; nothing is built here) and the data file. Each failure is a ConfigError naming the field and the
value. Every job runs them through `pipeline.compare.preflight`."""
from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from pipeline.config.schema import DataConfig, ModelConfig
from pipeline.core.cli import ConfigError
from pipeline.core.storage import not_local
from pipeline.data.remote_code import RemoteCodeError, check_remote_code
from pipeline.data.regeneration import is_regeneration, read_manifest
from pipeline.data.sources import check_readable
from pipeline.models.built import built_model_dir
from pipeline.models.info import ModelInfo, read_model_info


def _model_dir(model: ModelConfig) -> Path:
    if not model.build:
        return Path(model.path)
    return built_model_dir(model.build, model.path)


def resolve_model(model: ModelConfig) -> ModelInfo:
    """The model's facts; errors name model.path, and
    model.trust_remote_code when the checkpoint needs its own code to load and the setting is off."""
    try:
        info = read_model_info(_model_dir(model))
        check_remote_code(info.path, model.trust_remote_code)
    except RemoteCodeError as e:
        raise ConfigError(str(e)) from e
    except (OSError, ValueError) as e:
        raise ConfigError(str(e) if "model.path" in str(e) else f"model.path={model.path!r}: {e}") from e
    return info


def check_points_named(values: list, field_name: str, info: ModelInfo) -> None:
    """ConfigError when no capture point is named (`model=local`, and `model.path` without a model group, name none):
    the message says how to name them for this checkpoint's layer count."""
    if values:
        return
    n = info.num_layers
    example = ",".join(["embed", *(str(b) for b in sorted({2, n // 2, n - 3}) if 0 < b < n), "final_norm"])
    raise ConfigError(f"{field_name}=[]: no capture points are named for model.path={str(info.path)!r} (your own "
                      f"checkpoint inherits none): name them, e.g. model.points=[{example}] (boundary k = the residual "
                      f"stream after k of its {n} decoder layers, 0..{n}; embed = 0; final_norm = the LM head's input)")


def check_endpoint(endpoint: str | None) -> None:
    """s3_endpoint without credentials in it: it is recorded with the job's config."""
    if endpoint and urlsplit(endpoint).username is not None:
        raise ConfigError("s3_endpoint holds a user name or password: give credentials in AWS_ACCESS_KEY_ID and "
                          "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), never in the endpoint")


def check_data_path(data: DataConfig) -> None:
    """A readable prompt file, or a finished regeneration directory (pipeline.regenerate's)."""
    if (why := not_local(data.path)) is not None:
        raise ConfigError(f"data.path={data.path!r} {why}")
    if is_regeneration(Path(data.path)):
        try:
            read_manifest(Path(data.path))
        except (OSError, ValueError) as e:
            raise ConfigError(f"data.path={data.path!r}: {e}") from e
        return
    try:
        check_readable(data.path)
    except (OSError, ValueError) as e:
        raise ConfigError(f"data.path={data.path!r}: {e}") from e
