"""`python -m pipeline.export RUN_DIR --format speculators|specforge --out OUT_DIR [--aux POINTS [--convention C]]
[--last POINT] [--draft-vocab N] [--states copy|reference] [--storage fp8] [--spool-dir DIR]`; RUN_DIR and OUT_DIR
may be `s3://bucket/prefix`.

Writes a finished, verified run in the layout a trainer reads as it is (pipeline/exports/). POINTS are written as
`capture.points` takes them: canonical labels or boundaries (b3,b31,b59 or [3,31,59]), or with `--convention` a
framework's native ids, translated for the run's model as `capture.convention` is (--aux 2,30,58 --convention
specforge is b3,b31,b59). The defaults are the run's aux points (its boundaries between b0 and bN) and the last state
the layout needs (speculators: bN; SpecForge: final_norm). A run without bN (SGLang cannot capture it) exports to
speculators with `--last final_norm`: the last slot is final_norm divided by the target's final-norm weight, which
speculators' own norm maps back to final_norm (checked on every sample; pipeline/exports/unnorm.py). A rerun completes
a partial export.

`--states reference` (speculators only) copies no state: the export holds the token columns, the vocabulary files and
export.json, and speculators' trainer reads every state from the run itself through this project's backend
(`python -m pipeline.trainers.speculators`, pipeline/trainers/): one copy on disk. `--storage fp8` (speculators, a
full copy) writes speculators' own FP8 layout (one scale per token; read with `--hidden-states-backend fp8`) and
records its rounding error per slot in export.json.

Exit status (docs/reference/exit-codes.md): 0 exported (or already complete); 2 usage errors and runs that cannot
satisfy the layout; 3 a run that does not verify; 1 an I/O error (a rerun resumes); each one line.
"""
from __future__ import annotations

import argparse
import logging
import sys
from typing import Sequence

from pipeline.core.cli import ExitCode, interrupts_from_here, run_command
from pipeline.core.storage import location_arg
from pipeline.core.store_dir import DEFAULT_SPOOL

interrupts_from_here(__name__, "export")  # before the imports below (seconds): Ctrl-C there is one line too

from pipeline.exports.driver import export_run  # noqa: E402
from pipeline.exports.formats import FORMATS, exporter_for  # noqa: E402
from pipeline.exports.slots import aux_labels  # noqa: E402
from pipeline.points import FRAMEWORKS, split_points  # noqa: E402
from pipeline.shards.run_at import RunAt  # noqa: E402


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pipeline.export", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=location_arg,
                        help="a finished run directory (manifest.json + shards/), or a run on object storage "
                             "(s3://bucket/prefix: verified through a staged copy, read by ranges)")
    parser.add_argument("--format", required=True, choices=sorted(FORMATS), help="the trainer layout")
    parser.add_argument("--out", required=True, type=location_arg,
                        help="the export directory (new, or a partial export), or s3://bucket/prefix (each file "
                             "written in --spool-dir, then uploaded; export.json last)")
    parser.add_argument("--aux", type=split_points, default=None,
                        help="aux points as capture.points takes them: b3,b31,b59 or [3,31,59]")
    parser.add_argument("--convention", default="canonical", choices=FRAMEWORKS,
                        help="the numbering --aux is written in, as capture.convention (default: canonical)")
    parser.add_argument("--last", default=None,
                        help="the last slot's point (the one the layout needs; speculators also takes final_norm, "
                             "written divided by the final-norm weight, for runs without bN: SGLang's)")
    parser.add_argument("--draft-vocab", type=int, default=None, metavar="N",
                        help="speculators: also write token_freq.pt and d2t-N.npy/t2d-N.npy for the N most frequent "
                             "trained tokens, as speculators' own data preparation would")
    parser.add_argument("--states", default="copy", choices=("copy", "reference"),
                        help="copy: every sample's states into the trainer's files (default); reference "
                             "(speculators): none, the trainer reads them from the run (python -m "
                             "pipeline.trainers.speculators)")
    parser.add_argument("--storage", default=None, choices=("fp8",),
                        help="speculators, a full copy: the states in speculators' FP8 layout (float8_e4m3fn, one "
                             "scale per token; --hidden-states-backend fp8), rounding error recorded per slot")
    parser.add_argument("--spool-dir", default=DEFAULT_SPOOL,
                        help=f"with --out s3://...: the local folder a file is written in before it is uploaded "
                             f"(default {DEFAULT_SPOOL})")
    return parser


def _aux(args: argparse.Namespace) -> list[str] | None:
    if args.aux is None:
        return None
    # Native ids are translated by the run's model; canonical labels need no manifest (plan_slots checks them).
    manifest = {} if args.convention == "canonical" else RunAt(args.run_dir).manifest()
    return aux_labels(args.aux, convention=args.convention, manifest=manifest)


def export(argv: Sequence[str] | None) -> ExitCode:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    result = export_run(args.run_dir, args.out, exporter_for(args.format, args.storage), aux=_aux(args),
                        last=args.last, draft_vocab=args.draft_vocab, states=args.states, spool_dir=args.spool_dir)
    slots = ", ".join(p.label for p in result.plan.points)
    if result.status == "complete":
        print(f"already complete: {result.out} ({args.format}, slots {slots}); nothing written")
    else:
        print(f"exported {result.written + result.skipped} samples to {result.out} ({args.format}, slots {slots}): "
              f"{result.written} written, {result.skipped} finished earlier, {result.bytes_written / 1e6:.1f} MB "
              f"in {result.seconds:.1f}s" + ("; the states stay in the run (--states reference): train with "
                                              "python -m pipeline.trainers.speculators" if args.states == "reference"
                                              else ""))
    return ExitCode.OK


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m pipeline.export` and the console script `pipeline-export`."""
    return run_command(lambda: export(argv))


if __name__ == "__main__":
    sys.exit(main())
