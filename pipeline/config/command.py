"""The Hydra entry points' one runner (extract, regenerate, diff): the config composed once, checked whole before
anything runs, and one way an outcome becomes a line and an exit code.

A plain run (no Hydra flag) composes the job's config once, with Hydra's own node, through Hydra's loader: an
override of an undeclared key, a group option that does not exist, a value of the wrong type or an interpolation that
does not resolve is a `configuration error:` line and exit status 2, not Hydra's composition error (exit 1, the code
a retrying scheduler retries). A `model.path` without a model group is the user's own checkpoint: the config is
composed again with `model=local` (pipeline.config.model_group). That config then runs as Hydra's job (its log file,
its run directory, `HydraConfig`), validated into the job's schema *before* the factory builds any model. With Hydra's
flags (`--help`, `--cfg job`, `-m`) Hydra's own `main` takes the command; a sweep's jobs are composed and checked
first, and each job runs through the same guard.

Inside the job only a `PipelineError` (the outcomes the CLI contract names, pipeline.core.cli) and an OSError (a full
disk: resumable) are one line. Anything else is a bug: its traceback is shown and the exit status is BUG, never the
resumable FAILED, so no scheduler reruns a bug for days.
"""
from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import Callable, Sequence

import hydra
from hydra import initialize_config_dir
from hydra._internal.callbacks import Callbacks
from hydra.core.global_hydra import GlobalHydra
from hydra.core.utils import run_job
from hydra.errors import HydraException
from hydra.types import HydraContext, RunMode
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from pipeline.config.compose import check_override_keys, register_configs, to_config
from pipeline.config.entries import CONF_DIR
from pipeline.config.model_group import GROUP, LOCAL, check_model_group, decide, model_choice
from pipeline.config.overrides import check_overrides, one_line
from pipeline.core.cli import BUG_LINE, ConfigError, ExitCode, PipelineError, RunFailed, os_error_text, run_command

Body = Callable[[DictConfig], "int | None"]
VERBOSE = "hydra.verbose=pipeline shows"


@dataclass(frozen=True, kw_only=True)
class HydraJob:
    """One Hydra entry point: what it composes, what it builds first and what it runs."""

    name: str  # `python -m pipeline.<name>`; Hydra's job name (its log file)
    config_name: str  # conf/<config_name>.yaml
    schema: type  # the typed config it composes into
    noun: str  # what it writes, in its stop lines: "run", "regeneration", "diff"
    units: str | None  # what a stopped job keeps for its rerun to resume ("shards"); None: nothing, it reruns whole
    build: Callable[[DictConfig], None]  # the factory's step: the model a recipe names, built when missing
    body: Body  # the job on the validated config: prints its summary, returns its exit code (None: OK)

    def stopped(self, cause: str) -> str:
        """The line of a job stopped by `cause` (an OSError's text)."""
        if self.units is None:
            return f"{self.noun} stopped: {cause}; fix the cause and rerun"
        return (f"{self.noun} stopped, no manifest written: {cause}; finished {self.units} are kept: fix the cause "
                f"and rerun the same command to resume")


def stop_line(e: PipelineError, job: HydraJob) -> str:
    """What a PipelineError says as the job's last line."""
    if e.nothing_written:  # an engine that did not start: its traceback locally, in the actor's log on Ray
        where = VERBOSE if e.__cause__ else "the engine actor's Ray log holds"
        return f"{e}; nothing was written ({where} the engine's traceback)"
    if isinstance(e, RunFailed):
        return f"{job.noun} failed, no manifest written (rerun the same command to resume): {e}"
    return f"{e.prefix}: {e}" if e.prefix else str(e)


def guarded(job: HydraJob, cfg: DictConfig) -> int:
    """Run the job on Hydra's composed config: its exit code, every outcome logged in one line, a bug with its
    traceback."""
    log = logging.getLogger(f"pipeline.{job.name}")
    try:
        check_model_group(cfg, job.config_name)  # a tiny model's settings never apply to a user's checkpoint
        to_config(cfg, job.schema)  # every typed check before the factory builds anything
        job.build(cfg)
        code = job.body(cfg)
    except PipelineError as e:
        log.debug("the error in full", exc_info=e.__cause__ or e)
        log.error("%s", stop_line(e, job))
        return e.exit_code
    except OSError as e:  # a full disk, a read-only mount, a failing device: one line, the traceback on request
        log.debug("the error in full", exc_info=e)
        log.error("%s (%s the traceback)", job.stopped(os_error_text(e)), VERBOSE)
        return ExitCode.FAILED
    except Exception as e:  # noqa: BLE001 - a bug: shown whole, and never the resumable exit status
        log.error("%s", BUG_LINE.format(kind=type(e).__name__), exc_info=e)
        return ExitCode.BUG
    return ExitCode.OK if code is None else int(code)


def _compose(job: HydraJob, overrides: list[str]) -> DictConfig:
    """The job's config with Hydra's node, every interpolation resolved once to check it; ConfigError otherwise."""
    app = GlobalHydra.instance().hydra  # the Hydra that `initialize_config_dir` set up
    try:
        cfg = app.compose_config(config_name=job.config_name, overrides=overrides, run_mode=RunMode.RUN)
        task = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
        OmegaConf.to_container(task, resolve=True)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(one_line(e)) from e
    return cfg


def composed(job: HydraJob, overrides: Sequence[str]) -> DictConfig:
    """The job's config as it will run (inside `initialize_config_dir`): `model=local` added for a user's own
    checkpoint named without a model group; ConfigError for anything that does not compose."""
    overrides = list(overrides)
    check_override_keys(overrides, job.config_name)
    cfg = _compose(job, overrides)
    if decide(overrides, model_choice(cfg, job.config_name)) == LOCAL:
        cfg = _compose(job, overrides + [f"{GROUP}={LOCAL}"])
    return cfg


def _run_once(job: HydraJob, overrides: Sequence[str]) -> int:
    with initialize_config_dir(config_dir=str(CONF_DIR), job_name=job.name, version_base="1.3"):
        try:
            cfg = composed(job, overrides)
        except ConfigError as e:
            print(f"configuration error: {e}", file=sys.stderr)
            return ExitCode.USAGE
        with open_dict(cfg.hydra):
            cfg.hydra.mode = RunMode.RUN
        callbacks = Callbacks(cfg)
        callbacks.on_run_start(config=cfg, config_name=job.config_name)
        context = HydraContext(config_loader=GlobalHydra.instance().config_loader(), callbacks=callbacks)
        ret = run_job(task_function=lambda task_cfg: guarded(job, task_cfg), config=cfg,
                      job_dir_key="hydra.run.dir", job_subdir_key=None, hydra_context=context)
        callbacks.on_run_end(config=cfg, config_name=job.config_name, job_return=ret)
        return int(ret.return_value)  # the guard's code: Ctrl-C and SIGTERM (BaseExceptions) went past run_job


_VALUED = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd",
           "--experimental-rerun"}
_INFO = {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}  # --info's optional value


def _split_flags(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(overrides, Hydra's flags with their values): Hydra's parser takes its overrides in one run, so one added
    after the user's (`+exp=kimi --cfg job` + `hydra.job.name=...`) must go before the flags."""
    overrides: list[str] = []
    flags: list[str] = []
    previous = None
    for arg in argv:
        is_value = previous in _VALUED or (previous in ("--info", "-i") and arg in _INFO)
        (flags if arg.startswith("-") or is_value else overrides).append(arg)
        previous = None if is_value else arg
    return overrides, flags


def _hydra_main(job: HydraJob, argv: Sequence[str]) -> int:
    """Hydra's own `main` for its flags (--help, --cfg, -m): a sweep's jobs checked first."""
    try:
        check_overrides(argv, job.config_name)
    except ConfigError as e:
        print(f"configuration error: {e}", file=sys.stderr)
        return ExitCode.USAGE

    def task(cfg: DictConfig) -> None:
        if code := guarded(job, cfg):
            sys.exit(code)

    overrides, flags = _split_flags(argv)
    sys.argv[1:] = [*overrides, f"hydra.job.name={job.name}", *flags]
    hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name=job.config_name)(task)()
    return ExitCode.OK


def run_hydra(job: HydraJob, argv: Sequence[str]) -> int:
    """`python -m pipeline.<job.name> [overrides]`: the job's exit code."""
    register_configs()
    if any(arg.startswith("-") for arg in argv):
        return run_command(lambda: _hydra_main(job, argv))
    return run_command(lambda: _run_once(job, argv))
