"""Peak memory of an export of N tokens versus 4N tokens, side by side (bounded by one shard: ratio ~1).

    .venv/bin/python bench/export_memory.py [--tokens 16384] [--hidden-size 1024] [--formats speculators,specforge]

Builds two synthetic runs (bench/export_throughput.py's: 8192 tokens per shard), then exports each in a fresh child
process (peak RSS via getrusage is per process, never goes down and survives execve, so this parent process stays
light: the runs are built in children too) and prints both peaks and their ratio.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.export_throughput import build_run, export  # noqa: E402


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16_384)
    parser.add_argument("--hidden-size", type=int, default=1024)
    parser.add_argument("--formats", default="speculators,specforge")
    parser.add_argument("--child", nargs=3, metavar=("RUN", "OUT", "FORMAT"), help=argparse.SUPPRESS)
    parser.add_argument("--build", nargs=2, metavar=("RUN", "TOKENS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build:
        print(build_run(Path(args.build[0]), int(args.build[1]), args.hidden_size))
        return
    if args.child:
        import pipeline.exports.driver  # noqa: F401  imports first, so the baseline holds them
        baseline = _peak_mib()
        seconds = export(Path(args.child[0]), Path(args.child[1]), args.child[2])
        print(json.dumps({"baseline_mib": baseline, "peak_mib": _peak_mib(), "seconds": seconds}))
        return
    with tempfile.TemporaryDirectory(prefix="export-memory-") as tmp:
        runs = {label: Path(tmp) / label for label in ("N", "4N")}
        sizes = {}
        for (label, run), n in zip(runs.items(), (args.tokens, 4 * args.tokens)):
            cmd = [sys.executable, __file__, "--build", str(run), str(n), "--hidden-size", str(args.hidden_size)]
            sizes[label] = int(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split()[-1])
        print(f"runs: N={args.tokens} tokens ({sizes['N'] / 2**20:.0f} MiB), 4N={4 * args.tokens} tokens "
              f"({sizes['4N'] / 2**20:.0f} MiB); 8192 tokens per shard, P=6, H={args.hidden_size}, bf16")
        for fmt in args.formats.split(","):
            peaks = {}
            for label, run in runs.items():
                cmd = [sys.executable, __file__, "--child", str(run), str(Path(tmp) / f"{fmt}-{label}"), fmt]
                done = subprocess.run(cmd, capture_output=True, text=True, check=True)
                peaks[label] = json.loads(done.stdout.strip().splitlines()[-1])
            small, large = peaks["N"], peaks["4N"]
            print(f"{fmt:<12} peak RSS {small['peak_mib']:7.1f} MiB vs {large['peak_mib']:7.1f} MiB   ratio "
                  f"{large['peak_mib'] / small['peak_mib']:.2f}   (above imports: "
                  f"{small['peak_mib'] - small['baseline_mib']:.1f} vs {large['peak_mib'] - large['baseline_mib']:.1f}"
                  f" MiB)")


if __name__ == "__main__":
    main()
