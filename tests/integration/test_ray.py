"""The Ray runner on a real Ray (loopback only): same output as the local runner, exactly-once under kills."""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from pipeline.shards.reader import RunReader
from tests.helpers import REPO
from tests.helpers.sweep import sampled

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ENV = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
SMALL = ["data.limit=12", "runner.max_tokens_per_shard=500", "runner.max_samples_per_shard=4"]


def extract(out: Path, *args: str, wait: bool = True):
    cmd = [sys.executable, "-m", "pipeline.extract", f"out_dir={out}", *SMALL, *args,
           f"hydra.run.dir={out.parent / (out.name + '-logs')}"]
    if not wait:
        return subprocess.Popen(cmd, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
    proc = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def markers(out: Path) -> int:
    return len(list((out / "shards").glob("*.done.json"))) if (out / "shards").exists() else 0


def wait_for(predicate, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.05)


def dataset(out: Path) -> dict[str, dict[str, torch.Tensor]]:
    reader = RunReader(out)
    return {sid: reader[sid] for sid in reader.sample_ids}


def assert_same_dataset(a: Path, b: Path) -> None:
    da, db = dataset(a), dataset(b)
    assert sorted(da) == sorted(db)
    for sid in da:
        for key in ("hidden_states", "input_ids", "loss_mask"):
            assert torch.equal(torch.as_tensor(da[sid][key]), torch.as_tensor(db[sid][key])), (sid, key)
    ma, mb = (json.loads((d / "manifest.json").read_text()) for d in (a, b))
    assert (ma["num_samples"], ma["num_tokens"]) == (mb["num_samples"], mb["num_tokens"])


def verify(out: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "pipeline.verify", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory, models_root):
    out = tmp_path_factory.mktemp("ray") / "uninterrupted"
    proc = extract(out, "runner=ray", "runner.overlap_writes=true", wait=False)  # actors write while capturing
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output.decode()[-4000:]
    verify(out)
    (out.parent / "driver.pid").write_text(str(proc.pid))
    return out


def test_the_gate_reference_engine_runs_on_the_cluster_not_in_the_driver(reference_run):
    """On a GPU cluster the driver may have no GPU: the gate's reference runs as a task with a replica's resources."""
    report = json.loads((reference_run / "diff" / "report.json").read_text())
    ran_on = {e["role"]: e["ran_on"] for e in report["engines"]}
    driver = int((reference_run.parent / "driver.pid").read_text())
    assert ran_on["reference"] and not ran_on["reference"].endswith(f"pid {driver}"), (ran_on, driver)
    assert report["status"] != "fail" and json.loads((reference_run / "manifest.json").read_text())["provenance"]["diff"]


def test_ray_runner_equals_local_runner(reference_run, tmp_path):
    local = tmp_path / "local"
    extract(local, "runner=local")
    assert_same_dataset(reference_run, local)
    shards = json.loads((reference_run / "manifest.json").read_text())["shards"]
    assert len(shards) >= 4


def kill_tree(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and the local Ray it started: as a crashed node would
    proc.wait()


@pytest.mark.parametrize("kill_after", sampled([1, 3], keep=[3]))  # 3: a rerun that resumes more than one unit
def test_driver_killed_mid_run_then_rerun_gives_the_same_dataset(reference_run, tmp_path, kill_after):
    out = tmp_path / "run"
    proc = extract(out, "runner=ray", wait=False)
    wait_for(lambda: markers(out) >= kill_after or proc.poll() is not None)
    kill_tree(proc)
    assert not (out / "manifest.json").exists()
    extract(out, "runner=ray")
    verify(out)
    assert_same_dataset(reference_run, out)
    ref_files = [s["files"] for s in json.loads((reference_run / "manifest.json").read_text())["shards"]]
    got_files = [s["files"] for s in json.loads((out / "manifest.json").read_text())["shards"]]
    assert got_files == ref_files  # byte-identical shards, whichever invocation wrote them


def capture_actor_pids() -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"]) if "ray::CaptureActor" in " ".join(p.info["cmdline"] or [])]


def test_killed_engine_actor_is_replaced_and_the_run_completes_exactly_once(reference_run, tmp_path):
    out = tmp_path / "run"
    proc = extract(out, "runner=ray", "runner.overlap_writes=true", wait=False)  # two units die with the actor
    wait_for(lambda: markers(out) >= 1 or proc.poll() is not None)
    pids = capture_actor_pids()
    assert pids, "no engine actor found"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output.decode()[-4000:]
    verify(out)
    assert_same_dataset(reference_run, out)


def test_a_unit_that_keeps_failing_ends_the_run_unfinished_and_a_rerun_completes_it(reference_run, tmp_path):
    """Every replacement actor dies too: retries are bounded, the failure is named, no manifest; the rerun resumes."""
    out = tmp_path / "run"
    proc = extract(out, "runner=ray", "runner.max_retries=1", wait=False)
    wait_for(lambda: markers(out) >= 1 or proc.poll() is not None)
    killed: set[int] = set()
    while proc.poll() is None:  # a crash on every attempt, as an engine that always OOMs on the next unit would
        for pid in set(capture_actor_pids()) - killed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            killed.add(pid)
        time.sleep(0.05)
    output = proc.stdout.read().decode()
    assert proc.returncode == 1, output[-4000:]
    assert len(killed) == 2, killed  # the first actor and its one replacement: max_retries=1 bounds the attempts
    assert "run failed, no manifest written" in output
    assert re.search(r"unit \d+ \(\w+\.\.\.\): ActorDiedError", output), output[-4000:]  # which unit, and why
    assert not (out / "manifest.json").exists()
    finished = markers(out)
    assert finished < len(json.loads((reference_run / "manifest.json").read_text())["shards"])
    rerun = extract(out, "runner=ray")
    assert f"({finished} finished earlier)" in rerun.stdout  # what had finished is kept, checksums and all
    verify(out)
    assert_same_dataset(reference_run, out)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ray_head():
    """A real Ray head, every listener on 127.0.0.1; afterwards its own processes (found by its temp dir, and the
    Ray processes `ray start` left) and their children stopped by pid: `ray stop` would stop every Ray on the
    machine."""
    import tempfile

    from tests.helpers.ray_cluster import Cluster
    from tests.helpers.seaweed import _free_ports

    ray_cli = str(Path(sys.executable).parent / "ray")
    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's unix socket paths must fit 107 bytes
    port, dash, client, agent, agent_grpc, metrics, runtime_env = _free_ports(7)
    # every listener on a port of its own: with Ray's defaults the job agent of a head started beside another Ray
    # cannot bind, and every submission is refused ("No available agent to submit job")
    start = [ray_cli, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
             "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}", f"--ray-client-server-port={client}",
             f"--dashboard-agent-listen-port={agent}", f"--dashboard-agent-grpc-port={agent_grpc}",
             f"--metrics-export-port={metrics}", f"--runtime-env-agent-port={runtime_env}", "--num-cpus=2",
             "--disable-usage-stats", f"--temp-dir={temp_dir}"]
    before = set(psutil.pids())
    head = Cluster(address=f"127.0.0.1:{port}", temp=Path(temp_dir), env=ENV, second_port=0)
    try:
        subprocess.run(start, env=ENV, check=True, capture_output=True, timeout=120)
        head.pids = {p.pid for p in psutil.process_iter(["pid", "cmdline"])
                     if p.pid not in before and "ray" in " ".join(p.info["cmdline"] or []).lower()}
        yield f"http://127.0.0.1:{dash}"
    finally:
        head.stop()


def test_ray_job_submit_of_the_tiny_default(ray_head, tmp_path):
    out = tmp_path / "submitted"
    # The head enables token auth (token in ~/.ray/auth_token); Ray 2.60's CLI only sends it in token mode.
    env = {**ENV, "RAY_ADDRESS": ray_head, "PIPELINE_PYTHON": sys.executable, "RAY_AUTH_MODE": "token",
           "PATH": f"{Path(sys.executable).parent}:{ENV['PATH']}"}
    proc = subprocess.run([str(REPO / "jobs" / "submit.sh"), f"out_dir={out}", *SMALL,
                           f"hydra.run.dir={tmp_path / 'job-logs'}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "succeeded" in proc.stdout.lower()
    verify(out)
    assert json.loads((out / "manifest.json").read_text())["num_samples"] == 12
