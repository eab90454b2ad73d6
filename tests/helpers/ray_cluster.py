"""A Ray cluster of two nodes on this machine for the tests: a head and a second node, each started with `ray start`
(every port chosen free, the listeners on 127.0.0.1, token authentication on), so a run's replicas can be placed on
both and one node can be lost mid-run. Its processes are found by the cluster's own temp directory and ports and
stopped by pid: `ray stop` would stop every Ray on the machine."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tests.helpers.seaweed import _free_ports

RAY = str(Path(sys.executable).parent / "ray")


@dataclass
class Cluster:
    address: str  # the GCS address runner.address takes
    temp: Path
    env: dict[str, str]
    second_port: int  # the second node's node-manager port: how its raylet is found
    pids: set[int] = field(default_factory=set)

    def _ours(self) -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter(["pid", "cmdline"]):
            cmd = " ".join(proc.info["cmdline"] or [])
            if str(self.temp) in cmd or proc.info["pid"] in self.pids:
                found.append(proc)
        return found

    def _kill_tree(self, roots: list[psutil.Process]) -> None:
        procs = set(roots)
        for root in roots:
            try:
                procs |= set(root.children(recursive=True))
            except psutil.NoSuchProcess:
                pass
        for proc in procs:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(list(procs), timeout=30)

    def lose_second_node(self) -> None:
        """kill -9 the second node's raylet and everything it started (its workers: the actors it holds)."""
        raylets = [p for p in self._ours()
                   if "raylet" in " ".join(p.info["cmdline"] or [])
                   and f"--node_manager_port={self.second_port}" in " ".join(p.info["cmdline"] or [])]
        assert raylets, "the second node's raylet is not running"
        self._kill_tree(raylets)

    def stop(self) -> None:
        self._kill_tree(self._ours())
        shutil.rmtree(self.temp, ignore_errors=True)


def start(env: dict[str, str], *, head_cpus: int = 1, second_cpus: int = 1, attempts: int = 3) -> Cluster:
    """Both nodes up; `env` (e.g. the object store's endpoint and credentials) is every node's environment, as a
    user gives each node its own. A `ray start` that fails (a port taken between its choice and its use, a loaded
    machine) is tried again on other ports; the last failure is raised with what Ray said."""
    for attempt in range(attempts):
        try:
            cluster = _start(env, head_cpus=head_cpus, second_cpus=second_cpus)
        except subprocess.CalledProcessError as e:
            if attempt + 1 == attempts:
                raise RuntimeError(f"ray start failed {attempts} times; last: {e.cmd[:3]} exit {e.returncode}: "
                                   f"{(e.stderr or b'').decode(errors='replace')[-2000:]}") from None
            continue
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(_alive_nodes(cluster)) < 2:
            time.sleep(1)
        return cluster
    raise AssertionError("unreachable")


def _start(env: dict[str, str], *, head_cpus: int, second_cpus: int) -> Cluster:
    temp = Path(tempfile.mkdtemp(prefix="rc-", dir="/tmp"))  # short: Ray's unix socket paths must fit 107 bytes
    env = {**os.environ, **env, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1", "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_AUTH_MODE": "token", "RAY_scheduler_spread_threshold": "0.0"}
    gcs, dash, client, *second = _free_ports(12)
    cluster = Cluster(address=f"127.0.0.1:{gcs}", temp=temp, env=env, second_port=second[0])
    before = {p.pid for p in psutil.process_iter()}
    try:
        subprocess.run([RAY, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={gcs}",
                        "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}", f"--ray-client-server-port={client}",
                        f"--num-cpus={head_cpus}", "--disable-usage-stats", f"--temp-dir={temp}"],
                       env=env, check=True, capture_output=True, timeout=120)
        nm, om, agent, agent_grpc, metrics, runtime_env, low, *_ = second
        subprocess.run([RAY, "start", f"--address={cluster.address}", "--node-ip-address=127.0.0.1",
                        f"--num-cpus={second_cpus}", f"--node-manager-port={nm}", f"--object-manager-port={om}",
                        f"--dashboard-agent-listen-port={agent}", f"--dashboard-agent-grpc-port={agent_grpc}",
                        f"--metrics-export-port={metrics}", f"--runtime-env-agent-port={runtime_env}",
                        f"--min-worker-port={low}", f"--max-worker-port={low + 200}", "--disable-usage-stats"],
                       env=env, check=True, capture_output=True, timeout=120)
    except BaseException:
        cluster.pids = _started(cluster, before, gcs)
        cluster.stop()
        raise
    cluster.pids = _started(cluster, before, gcs)
    return cluster


def _started(cluster: Cluster, before: set[int], gcs: int) -> set[int]:
    """The processes `ray start` left running for this cluster: new since `before` and naming its temp directory or
    its GCS port (their children are found from them). Never another test's, started meanwhile on this machine."""
    found = set()
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if proc.info["pid"] not in before and (str(cluster.temp) in cmd or f":{gcs} " in f"{cmd} "):
            found.add(proc.info["pid"])
    return found


def _alive_nodes(cluster: Cluster) -> list[str]:
    probe = "import ray; ray.init(address='%s'); print(sum(n['Alive'] for n in ray.nodes()))" % cluster.address
    done = subprocess.run([sys.executable, "-c", probe], env=cluster.env, capture_output=True, text=True, timeout=60)
    return ["node"] * int(done.stdout.strip() or 0) if done.returncode == 0 else []
