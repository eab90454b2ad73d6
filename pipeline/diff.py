"""`python -m pipeline.diff [overrides]`: the same prompts through several engines, compared point by point.

    python -m pipeline.diff                                          # HF bf16 vs HF float32 on the tiny Kimi target
    python -m pipeline.diff diff.engines=[sglang,vllm] diff.reference=hf@float32 model=tiny_kimi_bf16
    python -m pipeline.diff diff.engines=[{name:vllm,dtype:float32,label:vllm-fp32}] out_dir=runs/diff-vllm

Writes report.json, report.md and report.html into out_dir and prints a verdict table. Exit status: 0 pass or warn,
1 fail, 2 configuration error.
"""
from __future__ import annotations

import logging
import sys

import hydra
from omegaconf import DictConfig

from rich.console import Console

from pipeline.compare.stage import run_diff
from pipeline.compare.tables import verdict_table
from pipeline.config import ConfigError, exit_on_unknown_overrides, register_configs
from pipeline.factory import build_step

register_configs()
log = logging.getLogger("pipeline.diff")


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    try:
        build_step(cfg)  # the tiny model a recipe names, built when missing: the job's first step
        outcome = run_diff(cfg)
    except ConfigError as e:
        log.error("configuration error: %s", e)
        sys.exit(2)
    Console(width=160).print(verdict_table(outcome.result, outcome.report_dir.resolve()))
    for line in outcome.result.failures + outcome.result.warnings:
        print(f"  - {line}")
    print(f"report: {outcome.report_dir.resolve()}/report.html ({outcome.seconds:.1f}s)")
    if outcome.result.status == "fail":
        sys.exit(1)


if __name__ == "__main__":
    exit_on_unknown_overrides(sys.argv[1:])
    main()
