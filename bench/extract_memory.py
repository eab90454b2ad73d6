"""Peak RSS of the real extract job on 1x and 4x the data, side by side (not a test: run by hand).

    .venv/bin/python bench/extract_memory.py [--copies 4] [--max-tokens-per-shard 4096]

The writer holds one shard at a time, so peak memory should follow the shard size, not the dataset: the ratio of the
two peaks should stay near 1 while the data (and the bytes written) grow 4x.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUNDLED = REPO / "pipeline" / "data" / "bundled" / "conversations.jsonl"

_CHILD = """
import resource, subprocess, sys
rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def peak_rss_mib(cmd: list[str]) -> float:
    """Peak RSS of `cmd`, measured in a fresh wrapper so earlier runs do not leak into the maximum."""
    out = subprocess.run([sys.executable, "-c", _CHILD, *cmd], capture_output=True, text=True, check=True)
    rc, kib = out.stdout.split()
    if rc != "0":
        raise SystemExit(f"extract failed ({rc}): {' '.join(cmd)}")
    return int(kib) / 1024


def make_data(path: Path, copies: int) -> int:
    lines = [line for line in BUNDLED.read_text().splitlines() if line.strip()]
    path.write_text("\n".join(lines * copies) + "\n")
    return len(lines) * copies


def run(copies: int, scale: int, max_tokens: int, work: Path) -> dict:
    data = work / f"data-x{scale}.jsonl"
    records = make_data(data, copies * scale)
    out = work / f"run-x{scale}"
    cmd = [sys.executable, "-m", "pipeline.extract", f"out_dir={out}", f"data.path={data}",
           f"runner.max_tokens_per_shard={max_tokens}", f"hydra.run.dir={work / 'logs'}"]
    rss = peak_rss_mib(cmd)
    manifest = json.loads((out / "manifest.json").read_text())
    written = sum(f["bytes"] for s in manifest["shards"] for f in s["files"].values())
    return {"records": records, "tokens": manifest["num_tokens"], "shards": len(manifest["shards"]),
            "written_mib": written / 2**20, "peak_rss_mib": rss}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=4, help="bundled set copies in the 1x run")
    ap.add_argument("--max-tokens-per-shard", type=int, default=4096)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        one = run(args.copies, 1, args.max_tokens_per_shard, Path(tmp))
        four = run(args.copies, 4, args.max_tokens_per_shard, Path(tmp))
    print(f"{'':>10} {'records':>8} {'tokens':>8} {'shards':>6} {'written MiB':>12} {'peak RSS MiB':>13}")
    for name, r in (("1x", one), ("4x", four)):
        print(f"{name:>10} {r['records']:>8} {r['tokens']:>8} {r['shards']:>6} {r['written_mib']:>12.1f} "
              f"{r['peak_rss_mib']:>13.1f}")
    print(f"data ratio 4x/1x: {four['written_mib'] / one['written_mib']:.2f}   "
          f"peak RSS ratio 4x/1x: {four['peak_rss_mib'] / one['peak_rss_mib']:.2f}")


if __name__ == "__main__":
    main()
