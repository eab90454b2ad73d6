"""Same command, same tensors, whatever the runner (issue 24): a CPU engine computes with the threads the job starts
with, in a Ray actor as locally (Ray gives an actor of runner.cpus_per_replica=1 one thread, and bf16 CPU kernels
reduce in another order on another count: on an AMX CPU the states differed in the last bits), the count is in the
provenance and in every shard, and a resume that would mix counts says so.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from pipeline.core.stfile import read_header
from tests.helpers import REPO
from tests.helpers.runs import SMALL, env_with, extract_cmd, output, shards_of, verify

pytestmark = pytest.mark.reliability
WARNING = "resuming with {now} CPU thread(s) per engine, but finished shards were captured with another count " \
          "(shard-00000 with {then})"


def run(out: Path, *overrides: str, fault: str | None = None, **env: str) -> subprocess.CompletedProcess:
    extra = {"PIPELINE_FAULT": fault} if fault else {}
    return subprocess.run(extract_cmd(out, *SMALL, *overrides), cwd=REPO, env=env_with(**extra, **env),
                          capture_output=True, text=True, timeout=600)


def recorded_threads(out: Path) -> int:
    return json.loads((out / "manifest.json").read_text())["provenance"]["engine"]["extra"]["cpu_threads"]


def shard_threads(out: Path) -> list[str | None]:
    """Each shard's own record (its safetensors metadata), in shard order."""
    return [read_header(out / next(f for f in s["files"] if f.endswith(".safetensors")))[1].get("cpu_threads")
            for s in shards_of(out)]


@pytest.mark.parametrize("then, now", [("2", "1"), ("2", "2")], ids=["another-count", "the-same-count"])
def test_a_resume_that_would_mix_thread_counts_says_so(tmp_path, then, now):
    out = tmp_path / "run"
    killed = run(out, fault="kill@rename:shard-00000.done.json", OMP_NUM_THREADS=then)
    assert killed.returncode == -9 and not (out / "manifest.json").exists(), output(killed)[-3000:]
    resumed = run(out, OMP_NUM_THREADS=now)
    assert resumed.returncode == 0, output(resumed)[-3000:]
    warnings = [line for line in output(resumed).splitlines() if "resuming with" in line]
    if then == now:
        assert warnings == []
    else:
        assert len(warnings) == 1 and "[WARNING]" in warnings[0], output(resumed)[-3000:]
        assert WARNING.format(now=now, then=then) in warnings[0] and f"OMP_NUM_THREADS={then}" in warnings[0]
    assert shard_threads(out) == [then, now] and recorded_threads(out) == int(now)
    assert verify(out).returncode == 0  # a run of mixed counts is still one sound run: the warning said what it is


@pytest.mark.slow
def test_a_ray_replica_computes_with_the_threads_of_a_local_run(tmp_path):
    """runner.cpus_per_replica=1 (the default): before the fix the actor's engine recorded 1 thread, the local one
    torch's default (2 on two cores), and on an AMX CPU one shard's bf16 states differed."""
    local, ray = tmp_path / "local", tmp_path / "ray"
    for out, runner in ((local, "runner=local"), (ray, "runner=ray")):
        done = run(out, runner)
        assert done.returncode == 0, output(done)[-3000:]
    assert recorded_threads(ray) == recorded_threads(local) == torch.get_num_threads()
    assert shard_threads(ray) == shard_threads(local) == [str(torch.get_num_threads())] * 2
    assert [s["files"] for s in shards_of(ray)] == [s["files"] for s in shards_of(local)]  # the same bytes
