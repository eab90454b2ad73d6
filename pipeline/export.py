"""`python -m pipeline.export RUN_DIR --format speculators|specforge --out OUT_DIR [--aux POINTS] [--last POINT]`.

Writes a finished, verified run in the layout a trainer reads as it is (pipeline/exports/). POINTS are canonical
labels (b3,b31,b59); the defaults are the run's aux points (its boundaries between b0 and bN) and the last state the
layout needs (speculators: bN; SpecForge: final_norm). A rerun completes a partial export.

Exit status: 0 exported (or already complete); 2 usage errors and runs that cannot satisfy the layout (one line).
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Sequence

from pipeline.exports.driver import export_run
from pipeline.exports.formats import FORMATS, exporter_for
from pipeline.exports.slots import ExportError

EXIT_OK, EXIT_USAGE = 0, 2


def _points(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.export", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a finished run directory (manifest.json + shards/)")
    parser.add_argument("--format", required=True, choices=sorted(FORMATS), help="the trainer layout")
    parser.add_argument("--out", required=True, type=Path, help="the export directory (new, or a partial export)")
    parser.add_argument("--aux", type=_points, default=None, help="aux points, canonical labels: b3,b31,b59")
    parser.add_argument("--last", default=None, help="the last slot's point (must be the one the layout needs)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        result = export_run(args.run_dir, args.out, exporter_for(args.format), aux=args.aux, last=args.last)
    except ExportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    slots = ", ".join(p.label for p in result.plan.points)
    if result.status == "complete":
        print(f"already complete: {result.out} ({args.format}, slots {slots}); nothing written")
    else:
        print(f"exported {result.written + result.skipped} samples to {result.out} ({args.format}, slots {slots}): "
              f"{result.written} written, {result.skipped} finished earlier, {result.bytes_written / 1e6:.1f} MB "
              f"in {result.seconds:.1f}s")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
