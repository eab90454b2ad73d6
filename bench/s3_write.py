"""The writer's path to object storage against the raw upload of the same bytes, on SeaweedFS on loopback (#38 item 5).

    .venv/bin/python bench/s3_write.py [--tokens-per-unit 4096] [--units 4] [--repeats 3] [--server-dir DIR]
                                       [--link-mbps N]

The units of a run at Kimi-K2.5's width (hidden 7168 x 5 points, bf16) are captured once per round by
bench/wide_engine.py's stand-in engine behind `RemoteEngine` (as bench/kimi_width.py), kept in memory, then written
three ways, side by side (the machine is shared; SeaweedFS shares its cores and, unless --server-dir puts it
elsewhere, its disk with the client):
- local: through `run_units` as extract's local runner writes them (validation, safetensors + Parquet, sha256,
  marker), the engine's half replayed, so only the writers are timed;
- s3: the same to `s3://` as extract writes there: the prefix's lease held (`store_dir.held`), each unit written into
  the local spool, then published (`CaptureStage.publish`: lease checked, create-only uploads, marker);
- raw: the files the local round wrote, uploaded one by one with boto3's own `upload_file` through the store's client
  (its default transfer settings): the rate the same bytes reach the same server with nothing of ours around them.
--link-mbps N sends every request's body of the process through one link of N MB/s (a token bucket shared by all
threads and clients), standing for a node's link to a bucket across a network: the upload is then bound by the link,
not by the CPU the client and the server share on loopback. Figures are GB/s of captured states (10^9 bytes). Ratio
s3 / raw per round, its median (the goal: >= 0.8). Peak RSS of the local and s3 rounds above the process's resident size
before each (the captures are already in memory): the s3 path's is the upload's parts in flight (PART_BYTES x
UPLOAD_THREADS) and the client's buffers. The last line reads `s3_write: ratio=R local_gbs=L s3_gbs=S raw_gbs=W
peak_local_mib=A peak_s3_mib=B parts_mib=C`.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import synthetic_samples  # also: repository root on sys.path, cwd = root (the worker imports bench.wide_engine)
from kimi_width import HIDDEN, POINTS, reset_peak, rss_bytes, unit_bytes_of

GB = 1e9


def timed(write) -> tuple[float, int]:
    """Seconds and peak RSS growth (above the resident size before it) of `write()`."""
    base = rss_bytes()
    reset_peak()
    start = time.perf_counter()
    write()
    return time.perf_counter() - start, rss_bytes("VmHWM") - base


class Replayed:
    """The capture stage with its engine's half already done: `compute` hands back the captures taken before the
    round, so `run_units` times the writers alone (validation, shard files, sha256, marker; publish)."""

    def __init__(self, stage, captured) -> None:
        self.stage, self.captures = stage, {id(unit): captures for unit, captures in captured}

    def compute(self, unit):
        return self.captures[id(unit)]

    def write(self, run_dir, index, unit, captures):
        return self.stage.write(run_dir, index, unit, captures)

    def publish(self, run_dir, result):
        return self.stage.publish(run_dir, result)


class Link:
    """One link of `mbps` MB/s that every request body crosses in turn (botocore's before-send event)."""

    def __init__(self, mbps: float) -> None:
        self.rate, self.lock, self.free_at = mbps * 1e6, threading.Lock(), 0.0

    def __call__(self, request, **_) -> None:
        size = int(request.headers.get("Content-Length") or 0)
        with self.lock:
            self.free_at = max(time.monotonic(), self.free_at) + size / self.rate
            until = self.free_at
        time.sleep(max(0.0, until - time.monotonic()))


def through(link: Link) -> None:
    """Every S3 client the process makes from now on sends through `link`."""
    from pipeline.core import s3

    made = s3.S3Store.__init__

    def init(self, *args, **kwargs) -> None:
        made(self, *args, **kwargs)
        self.client.meta.events.register("before-send.s3", link)
    s3.S3Store.__init__ = init


def check(result) -> None:
    assert not result.rejects, result.rejects[0].detail


def local_round(stage, captured, run_dir: Path) -> tuple[float, int]:
    """The units written into `run_dir` as extract's local runner writes them."""
    from pipeline.run.contract import run_units

    return timed(lambda: run_units(Replayed(stage, captured), run_dir, enumerate(u for u, _ in captured), check,
                                   overlap=False))


def s3_round(stage, captured, url: str, spool_root: Path) -> tuple[float, int]:
    """The units written to `url` as extract writes them there: the lease held and the prefix prepared, each unit
    written into the spool and published."""
    from dataclasses import replace

    from pipeline.core import store_dir
    from pipeline.run.capture import CaptureStage
    from pipeline.run.contract import run_units
    from pipeline.shards.directory import RUN_DIR

    def write() -> None:
        with store_dir.held(url, {"bench": "s3_write"}, kind=RUN_DIR, spool_root=str(spool_root), wait=False,
                            overwrite=False) as held:
            held.prepare()
            to_store = CaptureStage(engine=stage.engine, settings=replace(stage.settings, target=held.target))
            run_units(Replayed(to_store, captured), held.out, enumerate(u for u, _ in captured), check,
                      overlap=False)

    return timed(write)


def raw_round(run_dir: Path, url: str) -> float:
    """Seconds to upload every file of `run_dir` with boto3's own upload_file, through the store's client."""
    from pipeline.core.stores import open_store

    store = open_store(url)
    files = sorted(p for p in run_dir.rglob("*") if p.is_file())
    start = time.perf_counter()
    for path in files:
        store.client.upload_file(str(path), store.bucket, f"{store.prefix}/{path.relative_to(run_dir).as_posix()}")
    return time.perf_counter() - start


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens-per-unit", type=int, default=4096, help="runner.max_tokens_per_shard")
    ap.add_argument("--units", type=int, default=4, help="units per round")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--server-dir", default=None,
                    help="where SeaweedFS keeps its data (default: the bench's temp dir, on the client's disk)")
    ap.add_argument("--link-mbps", type=float, default=None,
                    help="every request body through one link of this many MB/s (a bucket across a network)")
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    from pipeline.core import s3
    from pipeline.core.contracts import EngineSpec
    from pipeline.engines.process.remote import RemoteEngine
    from pipeline.points import parse_points
    from pipeline.run.capture import CaptureStage, StageSettings
    from pipeline.shards.plan import plan_units
    from tests.helpers import seaweed

    if args.link_mbps:
        through(Link(args.link_mbps))
    samples = synthetic_samples(args.tokens_per_unit * args.units)
    units = plan_units(samples, max_tokens_per_shard=args.tokens_per_unit, max_samples_per_shard=1024)
    states = sum(unit_bytes_of(u) for u in units)
    points = parse_points(POINTS, num_layers=61)
    spec = EngineSpec(name="wide-bench", dtype="bfloat16", batch_size=8,
                      options={"hidden_size": HIDDEN, "pool_tokens": 4096})
    settings = StageSettings(points=points, hidden_size=HIDDEN, batch_size=8, storage_dtype=None,
                             metadata={"bench": "s3_write"})
    print(f"{len(units)} units of <= {args.tokens_per_unit} tokens at hidden {HIDDEN} x {len(POINTS)} points bf16: "
          f"{states / GB:.2f} GB of states per round", flush=True)
    work = Path(tempfile.mkdtemp(prefix="s3-write-"))
    server_dir = Path(tempfile.mkdtemp(prefix="s3-write-server-", dir=args.server_dir))
    server = seaweed.start(server_dir)
    os.environ.update(server.env)
    engine = RemoteEngine(spec, target="bench.wide_engine:WideEngine", python=sys.executable, model_path="-",
                          points=points, num_layers=61)
    rows = []
    try:
        with engine:
            stage = CaptureStage(engine=engine, settings=settings)
            stage.capture(units[0][:1])  # warm-up
            for r in range(args.repeats):
                captured = [(unit, stage.capture(unit)) for unit in units]  # in memory: the writers alone are timed
                local_dir = work / f"local-{r}"
                local_s, local_peak = local_round(stage, captured, local_dir)
                s3_s, s3_peak = s3_round(stage, captured, server.url(f"run-{r}"), work / "spool")
                del captured
                raw_s = raw_round(local_dir, server.url(f"raw-{r}"))
                shutil.rmtree(local_dir)
                rows.append((states / local_s / GB, states / s3_s / GB, states / raw_s / GB, local_peak, s3_peak))
                print(f"round {r}: local {rows[-1][0]:.3f} GB/s, s3 {rows[-1][1]:.3f} GB/s, raw upload "
                      f"{rows[-1][2]:.3f} GB/s (s3/raw {rows[-1][1] / rows[-1][2]:.3f}); peak RSS +"
                      f"{local_peak / 2**20:.0f} MiB local, +{s3_peak / 2**20:.0f} MiB s3", flush=True)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(server_dir, ignore_errors=True)
    ratio = statistics.median(s / w for _, s, w, _, _ in rows)
    parts = s3.PART_BYTES * s3.UPLOAD_THREADS / 2**20
    print(f"s3_write: ratio={ratio:.3f} local_gbs={max(r[0] for r in rows):.3f} s3_gbs={max(r[1] for r in rows):.3f} "
          f"raw_gbs={max(r[2] for r in rows):.3f} peak_local_mib={max(r[3] for r in rows) / 2**20:.0f} "
          f"peak_s3_mib={max(r[4] for r in rows) / 2**20:.0f} parts_mib={parts:.0f}")


if __name__ == "__main__":
    main()
