"""bench/export_throughput.py runs end to end at a small size (its synthetic run verifies), so its figures in
bench/README.md can be remade: it failed at any size for a while, its manifest lacking keys format 3 requires."""
from __future__ import annotations

import subprocess
import sys

from tests.helpers import REPO


def test_the_export_throughput_bench_runs():
    done = subprocess.run([sys.executable, "bench/export_throughput.py", "--tokens", "4096", "--hidden-size", "64",
                           "--repeats", "1"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {line.split()[0] for line in done.stdout.splitlines() if line.strip()}
    assert {"copy", "speculators", "specforge"} <= rows, done.stdout
