"""`python -m pipeline.regenerate [overrides]`: the target writes the answers it will be asked to draft, through the
engine that serves it, token ids kept.

    python -m pipeline.regenerate model=smollm2 engine=vllm engine.dtype=float32 data.path=prompts.jsonl out_dir=regen
    python -m pipeline.regenerate +exp=kimi model.path=/models/Kimi-K2.5 data.path=/data/prompts.jsonl out_dir=/data/regen
    python -m pipeline.extract model=smollm2 data.path=regen          # captures exactly the generated ids

Writes a regeneration directory (pipeline/data/regeneration/): per conversation and turn, the prompt ids as the
model's chat template rendered them, the generated ids as the engine produced them, why each turn stopped and the
sampling values the engine applied; its manifest (written last) holds the engine, versions, kernels, model and
template digests, sampling, the input's digest and the code version. Rerunning the same command resumes it. Exit
status (docs/reference/exit-codes.md): 0 done, 1 failed (resumable), 2 configuration error, 130/143 interrupted.
"""
from __future__ import annotations

import sys

from pipeline.core.cli import interrupts_from_here

interrupts_from_here(__name__, "regenerate")  # before the imports below (seconds): Ctrl-C there is one line too

from omegaconf import DictConfig  # noqa: E402

from pipeline.config import RegenerateConfig  # noqa: E402
from pipeline.config.command import HydraJob, run_hydra  # noqa: E402
from pipeline.factory import build_step  # noqa: E402
from pipeline.regen.job import run_regenerate  # noqa: E402

def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))


def regenerate(cfg: DictConfig) -> None:
    summary = run_regenerate(cfg)
    m = summary.manifest
    rate = m["generated_tokens"] / summary.generate_seconds if summary.generate_seconds else 0.0
    print(f"regeneration directory: {summary.where}")
    print(f"regenerated {m['num_conversations']} conversations of {m['num_records']} records: {m['num_turns']} turns, "
          f"{m['generated_tokens']} tokens generated ({m['prompt_tokens']} prompt tokens) in {len(m['parts'])} "
          f"part(s) ({summary.resumed_units} finished earlier); {rate:.1f} generated tok/s; {summary.seconds:.1f}s")
    t = m["truncated"]
    print(f"ended: {_counts(m['end_reasons']) or 'none'}; {t['turns']} turn(s) stopped at max_tokens "
          f"({'kept' if t['policy'] == 'keep' else 'dropped'}: sampling.truncated={t['policy']})")
    rejects = m["rejects"]
    print(f"{rejects['total']} rejected" + (f" ({_counts(rejects['by_reason'])}; see rejects.parquet)"
                                            if rejects["total"] else ""))
    engine = m["provenance"]["engine"]
    print(f"answers by {engine['framework']} {engine['framework_version']} ({engine['dtype']}); sampling "
          f"{m['provenance']['sampling']['values']}")
    print(f"extract it with: python -m pipeline.extract data.path={summary.out_dir}")


JOB = HydraJob(name="regenerate", config_name="regenerate", schema=RegenerateConfig, noun="regeneration",
               units="parts", build=build_step, body=regenerate)


def main() -> int:
    """`python -m pipeline.regenerate` and the console script `pipeline-regenerate`: overrides from sys.argv."""
    return run_hydra(JOB, sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
