"""Object storage against the local disk, side by side, on SeaweedFS on loopback (#38 item 5, the parts built so far).

    .venv/bin/python bench/s3_io.py [--mb 1024] [--tokens 32768] [--repeats 3]

- upload: one shard-sized file (--mb, random bytes) through the store's create-only upload (`S3Store.upload`: a
  multipart upload of PART_BYTES parts on UPLOAD_THREADS threads, completed with If-None-Match) against the raw rate of
  the same bytes through the same client (boto3's managed `upload_file`, its default transfer settings), rounds
  alternating; the store's peak memory above the process's before (the high-water mark of RSS, read in a child
  process per upload so that one round's peak is not another's), against its bound PART_BYTES x UPLOAD_THREADS.
- read: every sample of a synthetic run at Kimi-K2.5's width (7168 x 5 points, bf16; bench/one_copy.py's) through
  `RunReader` from the local directory against from the bucket (ranged GETs of each sample's rows).
Goals: upload >= 0.8x the raw rate; peak memory under the bound. The last line reads
`s3_io: upload_ratio=U peak_mb=P bound_mb=B read_ratio=R`.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

_UPLOAD = """
import json, resource, sys, time
from pathlib import Path
import boto3
from pipeline.core.s3 import split_url
from pipeline.core.stores import open_store
way, url, key, path = sys.argv[1:5]
store, client = open_store(url), boto3.client("s3")
store.head("probe"), client.list_buckets()  # connections open and every module imported before the baseline
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
if way == "store":
    store.upload(key, Path(path))
else:
    bucket, prefix = split_url(url)
    client.upload_file(path, bucket, f"{prefix}/{key}")
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": seconds, "peak_kb": peak - before}))
"""


def upload_round(way: str, url: str, key: str, path: Path, env: dict) -> dict:
    done = subprocess.run([sys.executable, "-c", _UPLOAD, way, url, key, str(path)], cwd=REPO, env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{way} upload failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def read_rate(run, repeats: int) -> list[float]:
    import torch

    from pipeline.shards.reader import RunReader

    rates = []
    with RunReader(run) as reader:
        ids = reader.sample_ids
        for _ in range(repeats):
            start = time.perf_counter()
            for sample_id in ids:
                reader[sample_id]["hidden_states"].sum(dtype=torch.float32)  # every value touched
            rates.append(len(ids) / (time.perf_counter() - start))
    return rates


def num_samples(run: Path) -> int:
    return json.loads((run / "manifest.json").read_text())["num_samples"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=1024, help="size of the uploaded file")
    ap.add_argument("--tokens", type=int, default=32768, help="tokens of the synthetic Kimi-width run")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from one_copy import synthetic_run

    from pipeline.core import s3
    from pipeline.core.stores import open_store
    from tests.helpers import seaweed

    work = Path(tempfile.mkdtemp(prefix="s3-io-"))
    server = seaweed.start(work / "seaweed")
    env = {**os.environ, **server.env}
    os.environ.update(server.env)
    try:
        src = work / "shard.bin"
        with open(src, "wb") as f:
            for _ in range(args.mb):
                f.write(os.urandom(1 << 20))
        store_s, raw_s, peaks = [], [], []
        for r in range(args.repeats):
            raw = upload_round("raw", server.url(f"raw-{r}"), "shard.bin", src, env)
            mine = upload_round("store", server.url(f"store-{r}"), "shard.bin", src, env)
            raw_s.append(raw["seconds"])
            store_s.append(mine["seconds"])
            peaks.append(mine["peak_kb"] / 1024)
        size_mb = src.stat().st_size / 1e6
        ratios = [r / s for r, s in zip(raw_s, store_s)]
        print(f"upload {size_mb:.0f} MB: raw boto3 upload_file {size_mb / min(raw_s):.0f} MB/s, store.upload "
              f"{size_mb / min(store_s):.0f} MB/s (best of {args.repeats}); median per-round ratio "
              f"{statistics.median(ratios):.3f}; store peak RSS growth {max(peaks):.0f} MB")
        src.unlink()
        run = work / "run"
        synthetic_run(run, args.tokens, None)
        url = server.url("run")
        store = open_store(url)
        seaweed.upload_run(run, url)
        local, remote, raw_get = [], [], []
        shards = sorted(p.relative_to(run).as_posix() for p in run.rglob("*.safetensors"))
        shard_mb = sum((run / rel).stat().st_size for rel in shards) / 1e6
        for _ in range(args.repeats):
            local += read_rate(run, 1)
            remote += read_rate(url, 1)
            start = time.perf_counter()
            for rel in shards:  # the same client, whole objects in one GET each: the server's own rate
                store.get(rel)
            raw_get.append(shard_mb / (time.perf_counter() - start))
        read_ratios = [b / a for a, b in zip(local, remote)]
        print(f"read {args.tokens} tokens at Kimi width ({shard_mb:.0f} MB of states): local {max(local):.1f} "
              f"samples/s, s3 {max(remote):.1f} samples/s (best of {args.repeats}), median per-round ratio "
              f"{statistics.median(read_ratios):.3f}; s3 by sample {max(remote) * shard_mb / num_samples(run):.0f} "
              f"MB/s against whole-object GETs {max(raw_get):.0f} MB/s")
        bound = s3.PART_BYTES * s3.UPLOAD_THREADS / (1 << 20)
        print(f"s3_io: upload_ratio={statistics.median(ratios):.3f} peak_mb={max(peaks):.0f} bound_mb={bound:.0f} "
              f"read_ratio={statistics.median(read_ratios):.3f}")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
