"""`python -m pipeline.extract [overrides]`: capture hidden states into verified, provenance-carrying shards."""
from __future__ import annotations

import sys

from pipeline.core.cli import interrupts_from_here

interrupts_from_here(__name__, "extract")  # before the imports below (seconds): Ctrl-C there is one line too

from omegaconf import DictConfig  # noqa: E402

from pipeline.config import ExtractConfig  # noqa: E402
from pipeline.config.command import HydraJob, run_hydra  # noqa: E402
from pipeline.factory import build_step  # noqa: E402
from pipeline.run.answers import answers_line  # noqa: E402
from pipeline.run.gate import gate_lines, storage_lines  # noqa: E402
from pipeline.run.job import count_text, run_extract  # noqa: E402
from pipeline.run.plan import RunPlan  # noqa: E402


def extract(cfg: DictConfig) -> None:
    summary = run_extract(cfg)
    if isinstance(summary, RunPlan):  # plan=true: nothing started
        print("\n".join(summary.lines()))
        return
    where = summary.out_dir if isinstance(summary.out_dir, str) else summary.out_dir.resolve()
    print(f"run directory: {where}")
    reasons = f"{count_text(summary.rejects_by_reason)}; " if summary.rejects_by_reason else ""
    print(f"wrote {summary.num_samples} samples, {summary.num_tokens} tokens in {summary.num_shards} shard(s) "
          f"({summary.resumed_shards} finished earlier); {summary.num_rejects} rejected "
          f"({reasons}see rejects.parquet); {summary.num_truncated} truncated to data.max_length; "
          f"{summary.seconds:.1f}s")
    print(f"capture points: {', '.join(summary.points)}")
    if (line := answers_line(summary.regeneration, summary.engine)) is not None:
        print(line)
    for line in gate_lines(summary.gate, summary.seconds) + storage_lines(summary.storage, summary.gate):
        print(line)
    print(f"check it with: python -m pipeline.verify {summary.out_dir}")


JOB = HydraJob(name="extract", config_name="config", schema=ExtractConfig, noun="run", units="shards", build=build_step,
               body=extract)


def main() -> int:
    """`python -m pipeline.extract` and the console script `pipeline-extract`: overrides from sys.argv."""
    return run_hydra(JOB, sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
