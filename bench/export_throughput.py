"""Export throughput against a raw copy of the same bytes, side by side in one run (target: export / copy >= 0.8).

    .venv/bin/python bench/export_throughput.py [--tokens 32768] [--hidden-size 1024] [--repeats 3]

Builds a synthetic finished run (random bf16 hidden states at 6 points: b0, b1, b2, b3, b4 = bN of a 4-layer model,
final_norm; samples of 256-2048 tokens; 8192 tokens per shard), then alternates, `--repeats` times:
- copy: every shard file of the run copied to a new directory (read, write, fsync each file: what the export's atomic
  writes also pay);
- export <format>: `pipeline.exports.driver.export_run` with verification off (its own cost is printed apart:
  a one-time sha256 pass over the run that every export pays first);
and prints MB/s of the run's bytes for each, best-of and median, and the ratios export / copy.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

POINTS = ["b0", "b1", "b2", "b3", "b4", "final_norm"]
NUM_LAYERS = 4


def build_run(run: Path, num_tokens: int, hidden_size: int) -> int:
    """A verified run of random states; returns the bytes of its shard files."""
    import torch
    from common import synthetic_samples

    from pipeline.core.contracts import Capture
    from pipeline.shards import layout
    from pipeline.shards.manifest import write_manifest
    from pipeline.provenance import digest
    from pipeline.shards.layout import PREPARE_REJECTS, REJECTS_DIR
    from pipeline.shards.plan import plan_units
    from pipeline.shards.storage import run_record
    from pipeline.shards.writer import write_shard

    samples = synthetic_samples(num_tokens, vocab=150_000)
    entries = []
    for index, unit in enumerate(plan_units(samples, max_tokens_per_shard=8192, max_samples_per_shard=10_000)):
        items = [(s, Capture(sample_id=s.sample_id, input_ids_T=s.input_ids_T,
                             hidden_states_TPH=torch.randn(s.num_tokens, len(POINTS), hidden_size).to(torch.bfloat16)))
                 for s in unit]
        entries.append(write_shard(run, index, items, points=POINTS, metadata={"engine": "bench"}))
    tokens = sum(e.num_tokens for e in entries)
    prov = {"model": {"model_type": "llama", "num_layers": NUM_LAYERS}}
    shard_bytes = sum(f["bytes"] for e in entries for f in e.files.values())
    write_manifest(run, {  # every key format 3 requires (bench/one_copy.py's synthetic run writes the same)
        "format_version": layout.FORMAT_VERSION, "points": POINTS, "hidden_size": hidden_size, "dtype": "bfloat16",
        "shards": [e.to_dict() for e in entries], "num_samples": sum(e.num_samples for e in entries),
        "num_tokens": tokens, "num_loss_tokens": sum(e.num_loss_tokens for e in entries), "num_truncated": 0,
        "storage": run_record([e.storage for e in entries], POINTS, hidden_size=hidden_size, num_tokens=tokens,
                              shard_bytes=shard_bytes),
        "rejects": {"total": 0, "by_reason": {}, "files": [PREPARE_REJECTS, f"{REJECTS_DIR}/"]},
        "provenance": prov, "provenance_digest": digest(prov)})
    return shard_bytes


def raw_copy(run: Path, dest: Path) -> float:
    start = time.perf_counter()
    dest.mkdir(parents=True)
    for src in sorted((run / "shards").iterdir()):
        target = dest / src.name
        shutil.copyfile(src, target)
        with open(target, "rb+") as f:
            os.fsync(f.fileno())
    return time.perf_counter() - start


def export(run: Path, dest: Path, fmt: str) -> float:
    from pipeline.exports.driver import export_run
    from pipeline.exports.formats import exporter_for

    start = time.perf_counter()
    export_run(run, dest, exporter_for(fmt), verify=False)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32_768)
    parser.add_argument("--hidden-size", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--formats", default="speculators,specforge")
    args = parser.parse_args()
    formats = args.formats.split(",")
    with tempfile.TemporaryDirectory(prefix="export-bench-", dir=os.environ.get("BENCH_TMP")) as tmp:
        run = Path(tmp) / "run"
        run_bytes = build_run(run, args.tokens, args.hidden_size)
        from pipeline.shards.verify import verify_run

        start = time.perf_counter()
        assert verify_run(run) == []
        verify_s = time.perf_counter() - start
        times: dict[str, list[float]] = {"copy": [], **{f: [] for f in formats}}
        paths = list(times)
        for r in range(args.repeats):  # alternating rounds, the order rotated: load swings and writeback hit all alike
            for name in paths[r % len(paths):] + paths[:r % len(paths)]:
                dest = Path(tmp) / f"{name}{r}"
                times[name].append(raw_copy(run, dest) if name == "copy" else export(run, dest, name))
            for path in Path(tmp).iterdir():
                if path.name != "run":
                    shutil.rmtree(path)
    mb = run_bytes / 1e6
    print(f"run: {args.tokens} tokens, P={len(POINTS)}, H={args.hidden_size}, bf16, {mb:.0f} MB of shards; "
          f"{args.repeats} alternating rounds; verify (sha256 + checks, once per export): {mb / verify_s:.0f} MB/s")
    best_copy, median_copy = min(times["copy"]), statistics.median(times["copy"])
    print(f"{'path':<12} {'best MB/s':>10} {'median MB/s':>12} {'best ratio':>11} {'median ratio':>13}")
    for name, secs in times.items():
        best, median = min(secs), statistics.median(secs)
        print(f"{name:<12} {mb / best:>10.0f} {mb / median:>12.0f} {best_copy / best:>11.2f} "
              f"{median_copy / median:>13.2f}")


if __name__ == "__main__":
    main()
