"""A resume's first step on object storage: judging which units an earlier invocation finished, one unit at a time
against RESUME_THREADS at once, side by side on SeaweedFS on loopback.

    .venv/bin/python bench/resume.py [--units 400] [--repeats 3] [--latency-ms 0]

A prefix holds --units finished units as a run's shards leave them (each a marker object listing two files, the
files, and a rejects object); `unfinished_units` judges them all through `StoreTarget.finished` and `fetch` (what a
resumed extract runs: pipeline/run/capture.finished_on_store) with its pool of 1 and of RESUME_THREADS threads, rounds
alternating. Loopback answers in about a millisecond, and there the client's own CPU (2 cores) bounds the pool; a
bucket across a network takes 10-50 ms a request: --latency-ms adds that wait to each of the store's reads (a sleep
before the request, as a remote bucket's round trip would hold the thread). The last line reads
`resume: serial_s=S pooled_s=P ratio=R units=N latency_ms=L`.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _fill(store, units: int) -> None:
    from pipeline.shards.layout import shard_name, shard_paths
    from pipeline.shards.writer import ShardEntry, relative

    root = Path("/spool")
    for i in range(units):
        paths = shard_paths(root, i)
        files = {}
        for role in ("safetensors", "parquet"):
            rel = relative(root, paths[role])
            data = os.urandom(1024)
            store.put(rel, data)
            files[rel] = {"bytes": len(data), "sha256": "0" * 64}
        entry = ShardEntry(name=shard_name(i), num_samples=1, num_tokens=8, num_loss_tokens=4, files=files,
                           dtype="bfloat16", points=["b1"])
        store.put(relative(root, paths["marker"]), json.dumps(entry.to_dict()).encode())


def _delayed(store, seconds: float) -> None:
    for name in ("get", "head", "list"):
        call = getattr(store, name)

        def late(*a, _call=call, **kw):
            time.sleep(seconds)
            return _call(*a, **kw)
        setattr(store, name, late)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--units", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--latency-ms", type=float, default=0.0, help="added to each read request (a remote bucket)")
    args = ap.parse_args()
    from tests.helpers import seaweed

    work = Path(tempfile.mkdtemp(prefix="resume-"))
    server = seaweed.start(work / "seaweed")
    os.environ.update(server.env)
    try:
        from pipeline.core.store_dir import StoreTarget
        from pipeline.run import contract
        from pipeline.run.capture import finished_on_store

        url = server.url("resume")
        target = StoreTarget(url=url, endpoint=None, lock=".lock", token="t", spool_root=str(work / "spool"))
        _fill(target.store(), args.units)
        if args.latency_ms:
            _delayed(target.store(), args.latency_ms / 1000)
        spool = target.spool()

        class Plan:
            def finished(self, run_dir, index):
                return finished_on_store(target, spool, index)

        rounds: dict[int, list[float]] = {1: [], contract.RESUME_THREADS: []}
        pooled = contract.RESUME_THREADS
        for _ in range(args.repeats):
            for threads in rounds:
                contract.RESUME_THREADS = threads
                found: list = []
                start = time.perf_counter()
                todo = contract.unfinished_units(spool, args.units, found.append, Plan())
                rounds[threads].append(time.perf_counter() - start)
                assert not todo and [r.index for r in found] == list(range(args.units))
        serial, many = statistics.median(rounds[1]), statistics.median(rounds[pooled])
        print(f"units {args.units}, {args.latency_ms:g} ms added per read: one at a time {serial:.2f} s, {pooled} threads {many:.2f} s (medians of "
              f"{args.repeats})")
        print(f"resume: serial_s={serial:.3f} pooled_s={many:.3f} ratio={serial / many:.2f} units={args.units} "
              f"latency_ms={args.latency_ms:g}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
