"""`python -m pipeline.diff [overrides]`: the same prompts through several engines, compared point by point.

    python -m pipeline.diff                                          # HF bf16 vs HF float32 on the tiny Kimi target
    python -m pipeline.diff diff.engines=[sglang,vllm] diff.reference=hf@float32 model=tiny_kimi_bf16
    python -m pipeline.diff diff.engines=[{name:vllm,dtype:float32,label:vllm-fp32}] out_dir=runs/diff-vllm

Writes report.json, report.md and report.html into out_dir and prints a verdict table. Exit status
(docs/reference/exit-codes.md): 0 pass or warn, 3 fail, 2 configuration error, 1 an I/O error. Its config is
conf/diff.yaml (DiffJobConfig): model, data, diff, capture (what `diff.points` names), storage_dtype and out_dir; any
other key (`runner.*`, `engine.*`, `overwrite`) is a configuration error.
"""
from __future__ import annotations

import sys

from pipeline.core.cli import ExitCode, interrupts_from_here

interrupts_from_here(__name__, "diff")  # before the imports below (seconds): Ctrl-C there is one line too

from omegaconf import DictConfig  # noqa: E402
from rich.console import Console  # noqa: E402

from pipeline.compare.job import run_diff  # noqa: E402
from pipeline.compare.tables import verdict_table  # noqa: E402
from pipeline.config import DiffJobConfig  # noqa: E402
from pipeline.config.command import HydraJob, run_hydra  # noqa: E402
from pipeline.factory import build_step  # noqa: E402


def diff(cfg: DictConfig) -> int:
    outcome = run_diff(cfg)
    Console(width=160).print(verdict_table(outcome.result, outcome.report_dir.resolve()))
    for line in outcome.result.failures + outcome.result.warnings:
        print(f"  - {line}")
    print(f"report: {outcome.report_dir.resolve()}/report.html ({outcome.seconds:.1f}s)")
    return ExitCode.REFUSED if outcome.result.status == "fail" else ExitCode.OK


JOB = HydraJob(name="diff", config_name="diff", schema=DiffJobConfig, noun="diff", units=None, build=build_step,
               body=diff)


def main() -> int:
    """`python -m pipeline.diff` and the console script `pipeline-diff`: overrides from sys.argv."""
    return run_hydra(JOB, sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
