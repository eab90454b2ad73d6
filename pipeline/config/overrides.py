"""The Hydra entry points' overrides, checked before Hydra runs: every configuration error is exit status 2.

Hydra reports what it refuses while composing (a group option that does not exist, `engine=nosuch`; a value of the
wrong type, `runner.max_tokens_per_shard=abc`) with exit status 1, the code the CLI contract gives a run that a rerun
resumes: a retrying scheduler would retry a configuration error. Composing once here first (and resolving every
interpolation, `out_dir=${oops}`) turns those into the configuration errors they are, in one line; with `-m` /
`--multirun`, every job of the sweep is composed so.
"""
from __future__ import annotations

from typing import Sequence

from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pipeline.config.entries import CONF_DIR
from pipeline.config.compose import check_override_keys
from pipeline.core.cli import ConfigError


MULTIRUN_FLAGS = ("-m", "--multirun")


def one_line(e: BaseException) -> str:
    """Hydra's message without its search path, and the first line of OmegaConf's cause (the rest is its object
    dump); an OmegaConf error of its own (an interpolation that does not resolve) as `key: its first line`."""
    if isinstance(e, OmegaConfBaseException):
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        key = getattr(e, "full_key", None)
        return f"{key}: {first}" if key else first
    text = " ".join(str(e).split("Config search path:")[0].split())
    cause = e.__cause__
    if isinstance(cause, OmegaConfBaseException) and str(cause).strip():
        text += f": {str(cause).strip().splitlines()[0]}"
    return text


def _config_overrides(argv: Sequence[str]) -> list[list[str]] | None:
    """The overrides of every job the command runs (one, or each of a `-m` sweep's), without Hydra's own keys; None
    when Hydra's own flags (--help, --cfg, ...) take the command."""
    flags = [arg for arg in argv if arg.startswith("-")]
    overrides = [arg for arg in argv if not arg.startswith("-") and not arg.lstrip("+~").startswith(("hydra.", "hydra/"))]
    if not flags:
        return [overrides]
    if not set(flags) <= set(MULTIRUN_FLAGS):
        return None
    parsed = OverridesParser.create().parse_overrides(overrides)  # an unparsable one: HydraException, as Hydra's own
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


def check_overrides(argv: Sequence[str], config_name: str = "config") -> None:
    """ConfigError when the overrides of a command Hydra's flags take (`-m` sweeps) name a key the job's schema
    (conf/<config_name>.yaml's) does not declare (the closest valid one named), do not compose, or hold an
    interpolation that does not resolve; return when Hydra can run them."""
    check_override_keys(argv, config_name)
    try:
        jobs = _config_overrides(argv)
        if jobs is None:
            return
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            for overrides in jobs:
                OmegaConf.to_container(compose(config_name=config_name, overrides=overrides), resolve=True)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(one_line(e)) from e
