"""bench/s3_io.py (uploads through the store against boto3's own, samples read by range from a bucket against from
disk, on SeaweedFS) runs end to end at its smallest size, so the figures in bench/README.md can be remade; its memory
bound is checked (a size, not a timing)."""
from __future__ import annotations

import re
import subprocess
import sys

from tests.helpers import REPO


def test_the_s3_bench_runs_and_the_upload_memory_stays_bounded():
    done = subprocess.run([sys.executable, "bench/s3_io.py", "--mb", "160", "--tokens", "2048", "--repeats", "1"],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    found = re.fullmatch(r"s3_io: upload_ratio=([\d.]+) peak_mb=(\d+) bound_mb=(\d+) read_ratio=([\d.]+)", last)
    assert found, done.stdout
    upload, peak, bound, read = map(float, found.groups())
    assert upload > 0 and read > 0  # rates, measured; their goals live in the bench's figures, not in a timed test
    # the parts in flight and a fixed allowance for the client (its threads, connections and buffers: ~20 MB measured
    # at 1 GB as at 160 MB); the whole file held would be 160 MB
    assert peak <= bound + 40, f"a 160 MB upload grew the process by {peak} MB; parts in flight are {bound} MB"


def test_the_s3_write_bench_runs_and_the_writers_memory_stays_bounded():
    """bench/s3_write.py (units written to a bucket as extract writes them, against the raw upload of the same bytes)
    at its smallest size; the S3 path's peak memory above the local writer's is at most the upload's parts in flight
    plus a margin for the client's own buffers (a size, not a timing). Through a 100 MB/s link (`--link-mbps`), no
    upload beats the link."""
    done = subprocess.run([sys.executable, "bench/s3_write.py", "--tokens-per-unit", "512", "--units", "2",
                           "--repeats", "1", "--link-mbps", "100"], cwd=REPO, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    found = re.fullmatch(r"s3_write: ratio=([\d.]+) local_gbs=([\d.]+) s3_gbs=([\d.]+) raw_gbs=([\d.]+) "
                         r"peak_local_mib=(\d+) peak_s3_mib=(\d+) parts_mib=(\d+)", last)
    assert found, done.stdout
    ratio, local, s3, raw, peak_local, peak_s3, parts = map(float, found.groups())
    assert min(ratio, local, s3, raw) > 0
    assert max(s3, raw) <= 0.1 * 1.01, f"uploads at {s3} and {raw} GB/s of states through a link of 0.1 GB/s"
    assert peak_s3 <= peak_local + parts + 64, f"the S3 path grew the process by {peak_s3} MiB ({peak_local} local)"


def test_the_resume_bench_runs():
    """bench/resume.py (a resume's unit checks one at a time against the pool, on SeaweedFS) at its smallest size:
    every unit found finished both ways (the bench asserts it)."""
    done = subprocess.run([sys.executable, "bench/resume.py", "--units", "12", "--repeats", "1", "--latency-ms", "5"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"resume: serial_s=[\d.]+ pooled_s=[\d.]+ ratio=[\d.]+ units=12 latency_ms=5", last), last
