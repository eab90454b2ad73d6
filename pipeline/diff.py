"""`python -m pipeline.diff [overrides]`: the same prompts through several engines, compared point by point.

    python -m pipeline.diff                                          # HF bf16 vs HF float32 on the tiny Kimi target
    python -m pipeline.diff diff.engines=[sglang,vllm] diff.reference=hf@float32 model=tiny_kimi_bf16
    python -m pipeline.diff diff.engines=[{name:vllm,dtype:float32,label:vllm-fp32}] out_dir=runs/diff-vllm

Writes report.json, report.md and report.html into out_dir and prints a verdict table. Exit status (README.md, "Exit
codes"): 0 pass or warn, 3 fail, 2 configuration error, 1 an I/O error. Its config is conf/diff.yaml (DiffJobConfig):
model, data, diff, capture (what `diff.points` names), storage_dtype and out_dir; any other key (`runner.*`,
`engine.*`, `overwrite`) is a configuration error.
"""
from __future__ import annotations

import logging
import sys

from pipeline.core.cli import ExitCode, interrupts_from_here, os_error_text, run_command

interrupts_from_here(__name__, "diff")  # before the imports below (seconds): Ctrl-C there is one line too

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402
from rich.console import Console  # noqa: E402

from pipeline.compare.stage import run_diff  # noqa: E402
from pipeline.compare.tables import verdict_table  # noqa: E402
from pipeline.config import (CONF_DIR, ConfigError, check_model_group, exit_on_bad_overrides,  # noqa: E402
                             model_group_overrides, register_configs)
from pipeline.factory import build_step  # noqa: E402

register_configs()
log = logging.getLogger("pipeline.diff")


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="diff")
def diff(cfg: DictConfig) -> None:
    try:
        check_model_group(cfg, "diff")  # a tiny model's settings never apply to a user's checkpoint
        build_step(cfg)  # the tiny model a recipe names, built when missing: the job's first step
        outcome = run_diff(cfg)
    except ConfigError as e:
        log.error("configuration error: %s", e)
        sys.exit(e.exit_code)
    except OSError as e:  # e.g. a full disk under the report: one line, the traceback on request
        log.debug("the error in full", exc_info=e)
        log.error("diff stopped: %s (hydra.verbose=pipeline shows the traceback)", os_error_text(e))
        sys.exit(ExitCode.FAILED)
    Console(width=160).print(verdict_table(outcome.result, outcome.report_dir.resolve()))
    for line in outcome.result.failures + outcome.result.warnings:
        print(f"  - {line}")
    print(f"report: {outcome.report_dir.resolve()}/report.html ({outcome.seconds:.1f}s)")
    if outcome.result.status == "fail":
        sys.exit(ExitCode.REFUSED)


def main() -> int:
    """`python -m pipeline.diff` and the console script `pipeline-diff`: overrides from sys.argv."""
    exit_on_bad_overrides(sys.argv[1:], config_name="diff")
    sys.argv[1:] = model_group_overrides(sys.argv[1:], config_name="diff")  # model.path without a model group
    return run_command(diff)


if __name__ == "__main__":
    sys.exit(main())
