"""The Hydra entry points' overrides, checked before Hydra runs: every configuration error is exit status 2.

Hydra reports what it refuses while composing (a group option that does not exist, `engine=nosuch`; a value of the
wrong type, `runner.max_tokens_per_shard=abc`) with exit status 1, the code the CLI contract gives a run that a rerun
resumes: a retrying scheduler would retry a configuration error. Composing once here first turns those into the
configuration errors they are, in one line.
"""
from __future__ import annotations

import sys
from typing import Sequence

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from pipeline.config.entries import CONF_DIR
from pipeline.config.compose import exit_on_unknown_overrides
from pipeline.core.cli import ExitCode


def _one_line(e: BaseException) -> str:
    """Hydra's message without its search path, and the first line of OmegaConf's cause (the rest is its object
    dump)."""
    text = " ".join(str(e).split("Config search path:")[0].split())
    cause = e.__cause__
    if isinstance(cause, OmegaConfBaseException) and str(cause).strip():
        text += f": {str(cause).strip().splitlines()[0]}"
    return text


def _config_overrides(argv: Sequence[str]) -> list[str] | None:
    """The overrides that set the job's config; None when Hydra's own flags (--help, --cfg, -m) take the command."""
    if any(arg.startswith("-") for arg in argv):
        return None
    return [arg for arg in argv if not arg.lstrip("+~").startswith(("hydra.", "hydra/"))]


def exit_on_bad_overrides(argv: Sequence[str], config_name: str = "config") -> None:
    """Exit 2 with one `configuration error:` line when the overrides name a key the job's schema (conf/<config_name>
    .yaml's) does not declare (the closest valid one named) or do not compose; return when Hydra can run them."""
    exit_on_unknown_overrides(argv, config_name)
    overrides = _config_overrides(argv)
    if overrides is None:
        return
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            compose(config_name=config_name, overrides=overrides)
    except (HydraException, OmegaConfBaseException) as e:
        print(f"configuration error: {_one_line(e)}", file=sys.stderr)
        sys.exit(ExitCode.USAGE)
