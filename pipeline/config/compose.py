"""The jobs' primary configs: each one's schema registered in Hydra's ConfigStore, and the composed config turned into
that schema's validated objects. Every job's config is closed (`pipeline.config.closed`): a key its schema does not
declare is a configuration error naming the key, through the same checks for every job.
"""
from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any, Sequence, TypeVar

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pipeline.config.closed import unknown_keys_message, unknown_override_keys
from pipeline.config.entries import CONF_DIR
from pipeline.config.regen_schema import RegenerateConfig
from pipeline.config.schema import DiffJobConfig, ExtractConfig
from pipeline.core.cli import ConfigError
from pipeline.models.built import models_root

# conf/<name>.yaml -> the schema it composes into (its defaults list names `<name's schema node>` first).
JOBS: dict[str, type] = {"config": ExtractConfig, "diff": DiffJobConfig, "regenerate": RegenerateConfig}
_NODES = {"config": "extract_schema", "diff": "diff_schema", "regenerate": "regenerate_schema"}
Job = TypeVar("Job")


def _package_data(relative: str) -> str:
    return str(Path(__file__).resolve().parents[1] / "data" / relative)


def _tiny_model_dir(name: str) -> str:
    return str(models_root() / name)


def register_configs() -> None:
    """Schemas + resolvers: `${pipeline_data:...}` (files shipped in the package, e.g. the bundled data) and
    `${tiny_model:NAME}` or `${built_model:NAME}` (where the factory builds the local models, tiny and converted:
    $PIPELINE_MODELS_DIR or <repo>/.cache/models)."""
    for config_name, schema in JOBS.items():
        ConfigStore.instance().store(name=_NODES[config_name], node=schema)
    OmegaConf.register_new_resolver("pipeline_data", _package_data, replace=True)
    OmegaConf.register_new_resolver("tiny_model", _tiny_model_dir, replace=True)
    OmegaConf.register_new_resolver("built_model", _tiny_model_dir, replace=True)  # the real converted models


def config_groups() -> list[str]:
    """conf/'s config groups (model, engine, exp, ...): `model=tiny_llama` chooses one, it sets no key."""
    return sorted(d.name for d in CONF_DIR.iterdir() if d.is_dir()) if CONF_DIR.is_dir() else []


def check_override_keys(argv: Sequence[str], config_name: str = "config") -> None:
    """For the Hydra entry points, before Hydra composes: a plain override of a key the job's schema does not declare
    (`runer.overlap_writes=true`) is the ConfigError it is (exit status 2, the closest valid key named), not Hydra's
    composition error (exit status 1) advising `+`."""
    if message := unknown_override_keys(JOBS[config_name], argv, config_groups()):
        raise ConfigError(message + _whose(argv, config_name))


_COMMANDS = {"config": "extract", "diff": "diff", "regenerate": "regenerate"}


def _whose(argv: Sequence[str], config_name: str) -> str:
    """`; gate is extract's, not regenerate's` for the top-level keys another job declares and this one does not."""
    declared = {name: {f.name for f in fields(schema)} for name, schema in JOBS.items()}
    for arg in argv:
        key = arg.lstrip("+~").split("=", 1)[0].split(".", 1)[0]
        if arg.startswith("-") or key in declared[config_name]:
            continue
        for other, keys in declared.items():
            if key in keys:
                return f"; {key} is {_COMMANDS[other]}'s, not {_COMMANDS[config_name]}'s"
    return ""


def to_config(cfg: DictConfig, schema: type[Job] = ExtractConfig) -> Job:  # type: ignore[assignment]
    """The composed Hydra config as `schema`'s validated objects; an unknown key (also one added with `+`) or a
    missing required value names its key."""
    unknown = unknown_keys_message(cfg)
    if unknown:
        raise ConfigError(unknown)
    try:
        missing = sorted(OmegaConf.missing_keys(cfg))
    except OmegaConfBaseException as e:  # an interpolation that does not resolve (`out_dir=${oops}`)
        raise ConfigError(f"{getattr(e, 'full_key', None) or 'config'}: {str(e).strip().splitlines()[0]}") from e
    if missing:
        raise ConfigError(f"required config value(s) missing: {', '.join(missing)} (pass them as overrides, "
                         f"e.g. {missing[0]}=...)")
    try:
        obj = OmegaConf.to_object(cfg)
    except ValueError as e:  # a __post_init__ check, possibly wrapped by OmegaConf with its own context
        raise ConfigError(str(e)) from e
    except OmegaConfBaseException as e:
        raise ConfigError(f"{getattr(e, 'full_key', None) or 'config'}: {str(e).strip().splitlines()[0]}") from e
    if not isinstance(obj, schema):  # a job handed another job's config would read keys it was never checked for
        raise ConfigError(f"the composed config's schema is {type(obj).__name__}, not {schema.__name__}")
    return obj


def resolved_dict(cfg: DictConfig) -> dict[str, Any]:
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
