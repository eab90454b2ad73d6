"""`python -m pipeline.doctor --draft DRAFT_DIR --serve sglang|vllm [--run RUN_DIR | --export EXPORT_DIR]
[--target MODEL_DIR] [--serve-version V] [--server-args "..."] [--json] [--no-load]`

Will this server feed this drafter the features it was trained on? Compares an EAGLE-3 draft checkpoint and a
serving setup with what the shards hold (pipeline/drafts/) and names every mismatch, one line per check:
`OK|WARN|MISMATCH|ERROR <check> <sentence>`, a summary line last (`--json`: the same as one JSON document). The
weight names are proven by loading the draft into the server's own draft class in the engine's environment on CPU
(`--no-load` skips that).

Exit status (docs/reference/exit-codes.md): 0 nothing is MISMATCH or ERROR; 3 something is; 2 usage errors (a missing or
unreadable file, named).
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from pipeline.core.cli import ExitCode, UsageError, interrupts_from_here, run_command
from pipeline.core.storage import location_arg, path_arg

interrupts_from_here(__name__, "doctor")  # before the imports below (seconds): Ctrl-C there is one line too

from pipeline.drafts.examine import Request, examine  # noqa: E402
from pipeline.drafts.load import check_weights, installed_version  # noqa: E402
from pipeline.drafts.report import failed, render_json, render_text  # noqa: E402
from pipeline.drafts.serving import SERVERS  # noqa: E402


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pipeline.doctor", description=__doc__.splitlines()[2])
    parser.add_argument("--draft", required=True, type=path_arg,
                        help="the draft checkpoint (config.json + safetensors)")
    parser.add_argument("--serve", required=True, choices=SERVERS, help="the serving framework")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--run", type=location_arg,
                        help="the run whose shards trained the drafter (a directory, or s3://bucket/prefix)")
    source.add_argument("--export", type=location_arg,
                        help="the export the trainer read (its export.json; a directory or s3://bucket/prefix)")
    parser.add_argument("--target", type=path_arg, help="the target model directory (config.json)")
    parser.add_argument("--serve-version", help="the serving framework's version (default: the one in its environment "
                        "here, .venv-sglang / .venv-vllm; else SGLang 0.5.23, vLLM 0.32.0)")
    parser.add_argument("--server-args", help="the serving command line's speculative flags, as pasted")
    parser.add_argument("--json", action="store_true", help="one JSON document instead of lines")
    parser.add_argument("--no-load", action="store_true", help="skip loading the draft in the engine's environment")
    return parser


def doctor(argv: Sequence[str] | None) -> ExitCode:
    args = parser().parse_args(argv)
    if args.run is None and args.export is None and args.target is None:
        raise UsageError("name the target: --run RUN_DIR, --export EXPORT_DIR or --target MODEL_DIR")
    request = Request(draft=args.draft, serve=args.serve, run=args.run, export=args.export, target=args.target,
                      serve_version=args.serve_version or installed_version(args.serve), server_args=args.server_args)
    findings, context = examine(request, weights=None if args.no_load else check_weights)  # DraftError, TargetError...
    print(render_json(findings, context) if args.json else render_text(findings))
    return ExitCode.REFUSED if failed(findings) else ExitCode.OK


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m pipeline.doctor` and the console script `pipeline-doctor`."""
    return run_command(lambda: doctor(argv))


if __name__ == "__main__":
    sys.exit(main())
