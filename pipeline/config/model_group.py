"""Whose settings a model gets: a user's checkpoint never inherits a tiny model's.

conf/'s tiny-model groups (the embedded default among them) describe one checkpoint each: the recipe the job builds
(`model.build`), capture points for that recipe's layer count and, for the Kimi-K2.5 layouts, `trust_remote_code:
true` (their tokenizer is the project's own code, written by the factory). None of that is true of another checkpoint,
so a `model.path` the user gives decides which group applies:

- with no model group chosen (the primary config's default stands, neither `model=` nor an experiment chose one), a
  `model.path` that is not the default's build directory is the user's own checkpoint: the command runs as
  `model=local` (conf/model/local.yaml: no recipe, trust_remote_code off, no capture points until named), with the
  user's other `model.*` overrides laid over it. The entry points' runner (pipeline.config.command) composes so.
- with a tiny-model group chosen, a `model.path` not named after its recipe is refused (`check_model_group`), saying
  what to write instead: the user's checkpoint as `model=local`, or the recipe built somewhere else.

A path named after the recipe (`model.path=/data/tiny-llama` with `model=tiny_llama`) is that tiny model built at
another root: the group's settings apply. Groups without a recipe (`kimi_k25`, `local`) take any path.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Sequence

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf

from pipeline.config.entries import CONF_DIR
from pipeline.core.cli import ConfigError
from pipeline.models.built import not_the_recipe_dir

GROUP = "model"
LOCAL = "local"  # conf/model/local.yaml: a user's checkpoint, nothing inherited


@dataclass(frozen=True, kw_only=True)
class ModelChoice:
    """What composing the command gave: the model group chosen, and the model settings it resolved to."""

    choice: str | None  # the model group option in effect (Hydra's runtime choice)
    default: str | None  # the primary config's own default option
    build: str | None  # model.build, after every override
    path: str | None  # model.path, resolved


def _parsed(overrides: Sequence[str]) -> list:
    parser = OverridesParser.create()
    found = []
    for text in overrides:
        try:
            found.append(parser.parse_override(text))
        except HydraException:
            continue  # Hydra reports it when it composes
    return found


def _given(overrides: Sequence[str], key: str) -> bool:
    return any(o.key_or_group == key and not o.is_delete() for o in _parsed(overrides))


def default_choice(config_name: str) -> str | None:
    """The model option conf/<config_name>.yaml's defaults list names (`tiny_k25_int4_8l`)."""
    for entry in OmegaConf.load(CONF_DIR / f"{config_name}.yaml").get("defaults", []):
        if isinstance(entry, DictConfig) and GROUP in entry:
            return str(entry[GROUP])
    return None


def decide(overrides: Sequence[str], model: ModelChoice) -> Literal["keep", "local"]:
    """"local" when the command names the user's own checkpoint without choosing a model group; "keep" when the
    composed group applies as it is. ConfigError when a tiny-model group was chosen for a path that is not its
    recipe's directory."""
    if model.path is None or not _given(overrides, f"{GROUP}.path"):
        return "keep"  # the path is the group's own
    if model.build and Path(model.path).name == model.build:
        return "keep"  # that recipe, built at another root
    chosen = _given(overrides, GROUP) or model.choice != model.default
    if not chosen:
        return "local"
    if model.build:
        raise ConfigError(not_the_recipe_dir(model.build, model.path, group=model.choice))
    return "keep"


def model_choice(cfg: DictConfig, config_name: str) -> ModelChoice:
    """What a config composed with Hydra's node (`return_hydra_config`) chose."""
    return _choice_of(cfg, cfg.hydra.runtime.choices.get(GROUP), config_name)


def _choice_of(cfg: DictConfig, choice: str | None, config_name: str) -> ModelChoice:
    model = cfg.get(GROUP) or {}
    path = model.get("path")
    return ModelChoice(choice=choice, default=default_choice(config_name), build=model.get("build"),
                       path=None if path is None else str(path))


def check_model_group(cfg: DictConfig, config_name: str = "config") -> None:
    """In the job, on Hydra's composed config: ConfigError when the model settings would not be the checkpoint's own:
    a tiny-model group for another path, or (in a `-m` sweep, whose jobs Hydra composes) the user's checkpoint under
    the default group."""
    hydra = HydraConfig.get()
    overrides = list(hydra.overrides.task)
    model = _choice_of(cfg, hydra.runtime.choices.get(GROUP), config_name)
    if decide(overrides, model) == "local":
        raise ConfigError(f"model.path={model.path!r} is your own checkpoint, and the default model group "
                          f"{model.choice!r} is a tiny model's settings (its build recipe, capture points and "
                          f"model.trust_remote_code): write {GROUP}={LOCAL} model.path={model.path} model.points=[...]")
