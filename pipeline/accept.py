"""`python -m pipeline.accept --draft DIR [--draft DIR2 ...] --serve vllm (--target MODEL_DIR | --run RUN_DIR |
--export EXPORT_DIR) --prompts FILE --out OUT_DIR [--num-speculative-tokens K] [--max-tokens N] [--temperature T]
[--dtype D] [--engine-option KEY=VALUE ...] [--overwrite]`

How much of each EAGLE-3 draft the target accepts when vLLM serves them together: acceptance length, per-position and
draft-token acceptance, from vLLM's own spec-decode counters, per prompt and overall; tokens/s with and without
speculation, and whether speculative output equals plain greedy output. The doctor's verdict on each draft stands
beside its figures. Prompts (chat JSONL records) are rendered through the target's chat template with the generation
prompt (raw text would inflate acceptance). With --run or --export the doctor also checks each draft against the
features it was trained on. Writes OUT_DIR/report.json (raw counters per prompt), report.md and report.html (the
per-position chart, the drafts side by side); a finished report is replaced only with --overwrite.

Exit status (docs/reference/exit-codes.md): 0 measured; 2 usage errors (a missing file, a draft vLLM refuses, --serve
sglang); 1 the engine failed at run time. A draft vLLM refuses or fails on does not stop the others: they are measured
and reported, the failure is in report.json ("failed") and one `error:` line, and the exit status is its own (the worst
of them); only when no draft can be measured is nothing written.
"""
from __future__ import annotations

import argparse
import math
import sys
from typing import Sequence

import yaml

from pipeline.core.cli import ExitCode, UsageError, interrupts_from_here, run_command
from pipeline.core.storage import location_arg, path_arg

interrupts_from_here(__name__, "accept")  # before the imports below (seconds): Ctrl-C there is one line too

from pipeline.acceptance.measure import SGLANG_REFUSAL, measure  # noqa: E402
from pipeline.acceptance.report import Settings  # noqa: E402


def parser() -> argparse.ArgumentParser:
    about = " ".join(__doc__.split("\n\n")[1].split())  # the paragraph after the usage lines
    parser = argparse.ArgumentParser(prog="python -m pipeline.accept", description=about)
    parser.add_argument("--draft", required=True, action="append", type=path_arg,
                        help="a draft checkpoint (repeatable)")
    parser.add_argument("--serve", required=True, choices=("vllm", "sglang"), help="the serving framework")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--target", type=path_arg, help="the target model directory")
    source.add_argument("--run", type=location_arg,
                        help="the run whose shards trained the drafter (its model directory; a directory or "
                             "s3://bucket/prefix)")
    source.add_argument("--export", type=location_arg,
                        help="the export the drafter was trained on (its run's model directory; a directory or "
                             "s3://bucket/prefix)")
    parser.add_argument("--prompts", required=True, type=path_arg, help="JSONL chat records")
    parser.add_argument("--out", required=True, type=path_arg, help="the report directory")
    parser.add_argument("--num-speculative-tokens", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--engine-option", action="append", default=[], metavar="KEY=VALUE", type=_engine_option,
                        help="an option of the measuring vLLM engine (pipeline.engines.vllm.options.SpeculateOptions), "
                             "e.g. gpu_memory_utilization=0.9 on a GPU node, kv_cache_space_gib=4 on CPU (repeatable)")
    parser.add_argument("--overwrite", action="store_true", help="replace a finished report in --out")
    return parser


def _engine_option(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: write KEY=VALUE")
    return key, yaml.safe_load(value)  # typed as in a config: 0.9, 4, true, null


def accept(argv: Sequence[str] | None) -> ExitCode:
    args = parser().parse_args(argv)
    if args.serve == "sglang":
        raise UsageError(SGLANG_REFUSAL)
    if args.num_speculative_tokens < 1 or args.max_tokens < 1 or not (math.isfinite(args.temperature)
                                                                     and args.temperature >= 0):
        raise UsageError("--num-speculative-tokens and --max-tokens must be >= 1, --temperature a finite number >= 0")
    settings = Settings(num_speculative_tokens=args.num_speculative_tokens, max_tokens=args.max_tokens,
                        temperature=args.temperature, dtype=args.dtype, engine_options=dict(args.engine_option))
    report = measure(args.draft, target=args.target, run=args.run, export=args.export, prompts=args.prompts,
                     out=args.out, settings=settings, overwrite=args.overwrite)
    for d in report.drafts:
        o = d.overall
        length = "-" if o.acceptance_length is None else f"{o.acceptance_length:.3f}"
        per_pos = " / ".join(f"{v:.3f}" for v in o.per_position or [])
        print(f"{d.name}: acceptance length {length}, per position {per_pos or '-'}, {d.tokens_per_s:.1f} "
              f"tok/s (plain {report.plain.tokens_per_s:.1f}), {d.differing} of {report.num_prompts} "
              f"outputs differ from plain greedy; doctor: {d.doctor.verdict}")
    print(f"report: {args.out.resolve() / 'report.html'} (and report.md, report.json)")
    for f in report.failed:  # measured without them; the worst of their exit codes is the command's
        print(f"error: {f.error}", file=sys.stderr)
    return max((ExitCode(f.exit_code) for f in report.failed), default=ExitCode.OK)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m pipeline.accept` and the console script `pipeline-accept`."""
    return run_command(lambda: accept(argv))


if __name__ == "__main__":
    sys.exit(main())
