"""Peak memory of capture + write (and of verify) for a dataset of N tokens versus 4N tokens, side by side.

    .venv/bin/python bench/writer_memory.py [--tokens 32768] [--hidden-size 1024] [--max-tokens-per-shard 8192]

Each measurement runs in a fresh child process (peak RSS via getrusage is per process and never goes down), which
synthesises prepared samples, plans work units, and for one unit at a time simulates the capture (random hidden
states), validates it and writes the shard. If memory is bounded by the shard size, as the design requires, the
two peaks are about equal (ratio ~1) although the second dataset is four times larger.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import synthetic_samples  # bench/ is on sys.path when run as a script

POINTS = ["b0", "b1", "b2", "b3", "final_norm"]


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def child_write(args: argparse.Namespace) -> dict:
    import torch

    from pipeline.core.contracts import Capture
    from pipeline.shards import layout
    from pipeline.shards.manifest import write_manifest
    from pipeline.shards.plan import plan_units
    from pipeline.shards.validate import check_capture
    from pipeline.shards.writer import write_shard

    baseline = _peak_rss_mib()
    samples = synthetic_samples(args.tokens, seed=0, vocab=150_000)
    units = plan_units(samples, max_tokens_per_shard=args.max_tokens_per_shard, max_samples_per_shard=10_000)
    entries = []
    start = time.perf_counter()
    for index, unit in enumerate(units):  # the caller's loop: capture one unit, validate, write, drop it
        items = []
        for sample in unit:
            hs = torch.randn(sample.num_tokens, len(POINTS), args.hidden_size).to(torch.bfloat16)
            capture = Capture(sample_id=sample.sample_id, input_ids_T=sample.input_ids_T, hidden_states_TPH=hs)
            reason = check_capture(sample, capture, num_points=len(POINTS), hidden_size=args.hidden_size)
            assert reason is None, reason
            items.append((sample, capture))
        entries.append(write_shard(Path(args.out), index, items, points=POINTS, metadata={"engine": "bench"}))
        del items
    seconds = time.perf_counter() - start
    write_manifest(Path(args.out), {
        "format_version": layout.FORMAT_VERSION, "points": POINTS, "hidden_size": args.hidden_size,
        "dtype": "bfloat16", "shards": [e.to_dict() for e in entries],
        "num_samples": sum(e.num_samples for e in entries), "num_tokens": sum(e.num_tokens for e in entries)})
    return {"baseline_mib": baseline, "peak_mib": _peak_rss_mib(), "shards": len(units), "seconds": seconds,
            "bytes": sum(f["bytes"] for e in entries for f in e.files.values())}


def child_verify(args: argparse.Namespace) -> dict:
    from pipeline.shards.verify import verify_run

    baseline = _peak_rss_mib()
    start = time.perf_counter()
    problems = verify_run(Path(args.out))
    assert problems == [], problems
    return {"baseline_mib": baseline, "peak_mib": _peak_rss_mib(), "seconds": time.perf_counter() - start}


def _spawn(mode: str, tokens: int, out: Path, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--child", mode, "--tokens", str(tokens), "--out", str(out),
           "--hidden-size", str(args.hidden_size), "--max-tokens-per-shard", str(args.max_tokens_per_shard)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _row(label: str, small: dict, large: dict) -> str:
    ratio = large["peak_mib"] / small["peak_mib"]
    grow_small, grow_large = (r["peak_mib"] - r["baseline_mib"] for r in (small, large))
    return (f"{label:<8} peak RSS {small['peak_mib']:8.1f} MiB vs {large['peak_mib']:8.1f} MiB   ratio {ratio:5.2f}"
            f"   (above imports: {grow_small:7.1f} vs {grow_large:7.1f} MiB; "
            f"{small['seconds']:.1f} s vs {large['seconds']:.1f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32_768, help="N; the second dataset has 4N tokens")
    parser.add_argument("--hidden-size", type=int, default=1024)
    parser.add_argument("--max-tokens-per-shard", type=int, default=8192)
    parser.add_argument("--child", choices=["write", "verify"], help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps((child_write if args.child == "write" else child_verify)(args)))
        return
    results = {}
    with tempfile.TemporaryDirectory(prefix="writer-memory-") as tmp:
        for label, tokens in (("N", args.tokens), ("4N", 4 * args.tokens)):
            out = Path(tmp) / label
            results[label] = {"write": _spawn("write", tokens, out, args), "verify": _spawn("verify", tokens, out, args)}
    shard_mib = args.max_tokens_per_shard * len(POINTS) * args.hidden_size * 2 / 2**20
    small, large = results["N"], results["4N"]
    print(f"P={len(POINTS)} H={args.hidden_size} bfloat16, max {args.max_tokens_per_shard} tokens/shard "
          f"(~{shard_mib:.0f} MiB of hidden states per shard)")
    print(f"datasets: N={args.tokens} tokens -> {small['write']['shards']} shards, "
          f"{small['write']['bytes'] / 2**20:.0f} MiB on disk; 4N={4 * args.tokens} tokens -> "
          f"{large['write']['shards']} shards, {large['write']['bytes'] / 2**20:.0f} MiB on disk")
    print(_row("write", small["write"], large["write"]))
    print(_row("verify", small["verify"], large["verify"]))


if __name__ == "__main__":
    main()
