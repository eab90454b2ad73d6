"""The capture stage's host path at Kimi-K2.5's width, against raw limits on the same bytes (a script, not a test).

    .venv/bin/python bench/kimi_width.py [--tokens-per-unit 4096] [--units 4] [--repeats 3] [--overlap]

Captures of hidden 7168 x 5 points in bf16 (72 KB per token) are produced inside an engine worker
(`pipeline.engines.process.worker` behind `RemoteEngine`, the transport vLLM's and SGLang's adapters use; the
"engine" is `bench/wide_engine.py`, which cuts them from a pool, so no forward pass hides the host path) and written
as extract writes them (`pipeline.run.capture`: validation, safetensors + Parquet, sha256, atomic finish).

Rounds alternate (the machine is shared): raw limits on as many bytes as the round captures, a unit at a time
(memory copy, the transport's raw bandwidth, a sequential file write with fsync per unit, handed to the disk as it
is written like the shard writer does, sha256); the stages one by one on the same units (transport, validation, write,
hash, Parquet); the whole path as extract runs it (`run_units`, --overlap: runner.overlap_writes). Figures are GB/s
of captured states (10^9 bytes), best-of and median over the repeats; the ratio whole / slowest raw limit is taken per
repeat (its best and median are printed). Peak RSS of the whole-path round is taken above the process's resident
size before it (imports, interpreter: the fixed overhead) and counted in units' captures. Targets: ratio >= 0.8,
peak <= 2 units. The last line reads `kimi_width: ratio=R limit=NAME peak_rss_units=U` (R: the median per-repeat
ratio; U: the largest peak over the repeats).

Memory: the worker's pool holds --pool-tokens tokens (default 4096: 294 MB); the driver holds a unit's captures
(--tokens-per-unit 4096: 294 MB) and, in the raw round, two buffers of that size. About 1.5 GB in all.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

from common import synthetic_samples  # also: repository root on sys.path, cwd = root (the worker imports bench.wide_engine)

HIDDEN, POINTS = 7168, ["b0", "b3", "b31", "b59", "final_norm"]
GB = 1e9
REFERENCE = ("pipe (reference)",)  # printed beside the limits, not one of them: the wire no longer uses it for captures


def rss_bytes(field: str = "VmRSS") -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux >= 4.0)


# ---- raw limits on the round's bytes -------------------------------------------------------------------------------

_SENDER = """
import os, socket, sys
kind, fd, size, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
data = memoryview(bytearray(os.urandom(1 << 20)) * (size >> 20) + bytearray(size % (1 << 20)))  # a unit's bytes
side = socket.socket(fileno=fd)
out = os.fdopen(int(sys.argv[5]), "wb", buffering=0)
for _ in range(count):
    side.recv(1)  # go
    done = 0
    if kind == "pipe":
        while done < size:
            done += out.write(data[done:])
    else:  # one write(2) into a memfd, its descriptor across the socket
        mfd = os.memfd_create("raw")
        while done < size:
            done += os.write(mfd, data[done:])
        socket.send_fds(side, [b"m"], [mfd])
        os.close(mfd)
"""


def raw_transport(size: int, count: int, kind: str) -> float:
    """Seconds to move `count` payloads of `size` bytes from another process with the bare system calls of a
    transport: a pipe sized as the engine worker's, read into one buffer; or a memfd written once, its descriptor
    across a Unix socket, mapped here (what `pipeline.engines.process.wire` does with a large payload)."""
    import mmap
    import socket

    from pipeline.engines.process.remote import _widen

    mine, theirs = socket.socketpair()
    r, w = os.pipe()
    _widen(w)
    child = subprocess.Popen([sys.executable, "-c", _SENDER, kind, str(theirs.fileno()), str(size), str(count),
                              str(w)], pass_fds=(theirs.fileno(), w))
    os.close(w)
    theirs.close()
    seconds = 0.0
    with os.fdopen(r, "rb", buffering=0) as f:
        for _ in range(count):
            buf = None
            start = time.perf_counter()
            mine.send(b"g")
            if kind == "pipe":
                buf = bytearray(size)  # a fresh buffer per payload, as wire.recv has: new pages cost too
                view, got = memoryview(buf), 0
                while got < size:
                    got += f.readinto(view[got:])
            else:
                _, fds, _, _ = socket.recv_fds(mine, 1, 1)
                mapped = mmap.mmap(fds[0], size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
                os.close(fds[0])
            seconds += time.perf_counter() - start
            del buf
            if kind != "pipe":
                mapped.close()
    child.wait()
    mine.close()
    return seconds


def raw_limits(unit_bytes: int, count: int, work: Path) -> dict[str, float]:
    """GB/s of each raw limit over `count` units' bytes (files: one per unit, each fsynced, as shards are)."""
    import torch

    src = torch.randint(0, 255, (unit_bytes,), dtype=torch.uint8)
    view = memoryview(src.numpy())
    out = dict.fromkeys(["memcpy", "transport", "file write+fsync", "sha256"], 0.0)
    dst = torch.empty_like(src)
    dst.fill_(0)  # pages touched: the copy alone
    for i in range(count):
        start = time.perf_counter()
        dst.copy_(src)
        out["memcpy"] += time.perf_counter() - start
    del dst
    out["transport"] = raw_transport(unit_bytes, count, "memfd")
    for i in range(count):
        path = work / f"raw-{i}.bin"
        start = time.perf_counter()
        with open(path, "wb", buffering=0) as f:
            for j in range(0, unit_bytes, 16 << 20):  # handed to the disk as written, as the shard writer does
                f.write(view[j:j + (16 << 20)])
                os.posix_fadvise(f.fileno(), j, 16 << 20, os.POSIX_FADV_DONTNEED)
            os.fsync(f.fileno())
        out["file write+fsync"] += time.perf_counter() - start
    for i in range(count):
        (work / f"raw-{i}.bin").unlink()
        start = time.perf_counter()
        hashlib.sha256(view).hexdigest()
        out["sha256"] += time.perf_counter() - start
    out["pipe (reference)"] = raw_transport(unit_bytes, count, "pipe")
    return {k: count * unit_bytes / v / GB for k, v in out.items()}


# ---- the pipeline's stages, one by one, and the whole path --------------------------------------------------------

def unit_bytes_of(unit) -> int:
    return sum(s.num_tokens for s in unit) * len(POINTS) * HIDDEN * 2


def stages(stage, units, work: Path) -> dict[str, float]:
    import pyarrow.parquet as pq

    from pipeline.core.io import atomic_path
    from pipeline.shards.validate import capture_reject
    from pipeline.shards.writer import _parquet_table, write_shard

    secs = dict.fromkeys(["transport", "validation", "write", "hash", "parquet"], 0.0)
    run_dir = work / "stages"
    for index, unit in enumerate(units):
        t0 = time.perf_counter()
        captures = stage.capture(unit)
        t1 = time.perf_counter()
        items = [(s, captures[s.sample_id]) for s in unit]
        assert not [r for s, c in items if (r := capture_reject(s, c, num_points=len(POINTS), hidden_size=HIDDEN))]
        t2 = time.perf_counter()
        write_shard(run_dir, index, items, points=POINTS, metadata={"bench": "kimi_width"})
        t3 = time.perf_counter()
        sha = hashlib.sha256()
        for _, c in items:
            sha.update(memoryview(c.hidden_states_TPH.reshape(-1).view(__import__("torch").uint8).numpy()))
        t4 = time.perf_counter()
        with atomic_path(work / "stage.parquet") as tmp:
            pq.write_table(_parquet_table(items), tmp)
        t5 = time.perf_counter()
        for key, a, b in zip(secs, (t0, t1, t2, t3, t4), (t1, t2, t3, t4, t5)):
            secs[key] += b - a
        del captures, items
    shutil.rmtree(run_dir)
    total = sum(unit_bytes_of(u) for u in units)
    return {k: total / v / GB for k, v in secs.items()}


def whole(stage, units, work: Path, overlap: bool) -> tuple[float, int]:
    """GB/s of the whole path as extract runs it, and its peak RSS above the resident size before it."""
    from pipeline.run.contract import run_units

    def check(result) -> None:
        if result.rejects:
            raise SystemExit(f"unit {result.index}: {result.rejects[0].detail}")

    run_dir = work / "whole"
    base = rss_bytes()
    reset_peak()
    start = time.perf_counter()
    run_units(stage, run_dir, enumerate(units), check, overlap=overlap)
    seconds = time.perf_counter() - start
    peak = rss_bytes("VmHWM") - base
    shutil.rmtree(run_dir)
    return sum(unit_bytes_of(u) for u in units) / seconds / GB, peak


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens-per-unit", type=int, default=4096, help="runner.max_tokens_per_shard")
    ap.add_argument("--units", type=int, default=4, help="units per round")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--pool-tokens", type=int, default=4096, help="the stand-in engine's pool")
    ap.add_argument("--batch-size", type=int, default=8, help="engine.batch_size")
    ap.add_argument("--overlap", action="store_true", help="runner.overlap_writes=true for the whole path")
    ap.add_argument("--work", default=None, help="directory for the files written (default: a temp dir)")
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    from pipeline.core.contracts import EngineSpec
    from pipeline.engines.process.remote import RemoteEngine
    from pipeline.points import parse_points
    from pipeline.run.capture import CaptureStage, StageSettings
    from pipeline.shards.plan import plan_units

    samples = synthetic_samples(args.tokens_per_unit * args.units)
    units = plan_units(samples, max_tokens_per_shard=args.tokens_per_unit, max_samples_per_shard=1024)
    unit_bytes = args.tokens_per_unit * len(POINTS) * HIDDEN * 2
    points = parse_points(POINTS, num_layers=61)
    spec = EngineSpec(name="wide-bench", dtype="bfloat16", batch_size=args.batch_size,
                      options={"hidden_size": HIDDEN, "pool_tokens": args.pool_tokens})
    settings = StageSettings(points=points, hidden_size=HIDDEN, batch_size=args.batch_size, storage_dtype=None,
                             metadata={"bench": "kimi_width"})
    print(f"hidden {HIDDEN} x {len(POINTS)} points bf16 = {len(POINTS) * HIDDEN * 2} B/token; {len(units)} units "
          f"of <= {args.tokens_per_unit} tokens ({unit_bytes / 2**20:.0f} MiB of captures per unit), "
          f"{len(samples)} samples, {sum(unit_bytes_of(u) for u in units) / GB:.2f} GB per round, "
          f"overlap_writes={args.overlap}")
    raw: list[dict[str, float]] = []
    staged: list[dict[str, float]] = []
    whole_gbs: list[float] = []
    peaks: list[int] = []
    engine = RemoteEngine(spec, target="bench.wide_engine:WideEngine", python=sys.executable, model_path="-",
                          points=points, num_layers=61)
    with tempfile.TemporaryDirectory(dir=args.work) as tmp, engine:
        work = Path(tmp)
        stage = CaptureStage(engine=engine, settings=settings)
        stage.capture(units[0][:1])  # warm-up
        for r in range(args.repeats):
            staged.append(stages(stage, units, work))
            raw.append(raw_limits(unit_bytes, len(units), work))  # next to the whole path: the same load
            gbs, peak = whole(stage, units, work, args.overlap)
            whole_gbs.append(gbs)
            peaks.append(peak)
            print(f"repeat {r}: raw " + ", ".join(f"{k} {v:.2f}" for k, v in raw[-1].items())
                  + " | stages " + ", ".join(f"{k} {v:.2f}" for k, v in staged[-1].items())
                  + f" | whole {gbs:.2f} GB/s, peak +{peak / 2**20:.0f} MiB", flush=True)
        worker_peak = engine.call("peak_rss_mib")
    report(raw, staged, whole_gbs, peaks, unit_bytes, worker_peak, args.pool_tokens * len(POINTS) * HIDDEN * 2)


def report(raw, staged, whole_gbs, peaks, unit_bytes: int, worker_peak_mib: float, pool_bytes: int) -> None:
    def line(name: str, values: list[float]) -> str:
        return f"  {name:<22} best {max(values):6.2f}  median {median(values):6.2f} GB/s"

    print("raw limits (the same bytes, a unit at a time):")
    for k in raw[0]:
        print(line(k, [r[k] for r in raw]))
    print("stages (the same units, one by one):")
    for k in staged[0]:
        print(line(k, [s[k] for s in staged]))
    print("whole path:")
    print(line("capture -> shard", whole_gbs))
    # the slowest raw limit of each repeat, and the per-repeat ratio against it
    slowest = [min((k for k in r if k not in REFERENCE), key=r.get) for r in raw]
    ratios = [w / r[s] for w, r, s in zip(whole_gbs, raw, slowest)]
    limit = max(set(slowest), key=slowest.count)
    units = max(peaks) / unit_bytes
    print(f"ratio whole / slowest raw limit: best {max(ratios):.3f}, median {median(ratios):.3f} (target >= 0.8; "
          f"slowest per repeat: {', '.join(slowest)})")
    print(f"peak RSS above the fixed overhead: {max(peaks) / 2**20:.0f} MiB = {units:.2f} units' captures "
          f"(target <= 2); engine worker peak {worker_peak_mib:.0f} MiB (its pool: {pool_bytes / 2**20:.0f} MiB)")
    print(f"kimi_width: ratio={median(ratios):.3f} limit={limit.split(' ')[0]} peak_rss_units={units:.2f}")


if __name__ == "__main__":
    main()
