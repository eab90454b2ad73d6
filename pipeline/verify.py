"""`python -m pipeline.verify RUN_DIR`: check a finished run directory before training on it.

Exit status: 0 sound (a summary on stdout); 1 problems found (each on its own stderr line); 2 not a finished run
(missing directory, or no manifest: an unfinished run).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from pipeline.shards.manifest import ManifestError, read_manifest
from pipeline.shards.verify import verify_run

EXIT_SOUND, EXIT_PROBLEMS, EXIT_NOT_A_RUN = 0, 1, 2


def _summary(run_dir: Path, manifest: dict) -> str:
    return (f"sound: {run_dir}: {len(manifest['shards'])} shard(s), {manifest['num_samples']} samples, "
            f"{manifest['num_tokens']} tokens, points {manifest['points']}, hidden_size {manifest['hidden_size']}, "
            f"dtype {manifest['dtype']}{_storage(manifest.get('storage'))}")


def _storage(storage: dict | None) -> str:
    if not storage or storage.get("dtype") == storage.get("capture_dtype"):
        return ""
    return f" (captured in {storage.get('capture_dtype')}, {storage.get('scaling')} scales; read back dequantized)"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.verify", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a run directory holding manifest.json and shards/")
    args = parser.parse_args(argv)
    try:
        manifest = read_manifest(args.run_dir)
    except ManifestError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_NOT_A_RUN
    problems = verify_run(args.run_dir)
    if problems:
        for problem in problems:
            print(problem, file=sys.stderr)
        print(f"{len(problems)} problem(s) in {args.run_dir}", file=sys.stderr)
        return EXIT_PROBLEMS
    print(_summary(args.run_dir, manifest))
    return EXIT_SOUND


if __name__ == "__main__":
    sys.exit(main())
