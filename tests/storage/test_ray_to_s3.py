"""The Ray runner writing to object storage (SeaweedFS on loopback), with no shared directory: each replica writes its
units into its own node's spool and publishes them, and the run in the bucket is the local runner's on disk, byte for
byte. On a cluster of two nodes the units run on both; a node lost mid-run (its raylet killed, its actor holding a
unit) leaves the run to finish on the other, nothing lost, nothing written twice. Its own module: it starts Ray
clusters, so it runs in the engine stream (tests/conftest.py)."""
from __future__ import annotations

import re
import subprocess
import time

import pytest

from pipeline.core.stores import open_store
from tests.helpers import ray_cluster
from tests.helpers.runs import REPO, SMALL, finished_run, output
from tests.helpers.s3_runs import extract_s3, extract_s3_cmd, s3_run_env, same_run

UNITS = ("data.limit=10", "runner.max_samples_per_shard=1")  # ten units: one node can be lost with units left
RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


def test_ray_replicas_publish_their_own_units_to_the_same_bytes(local_run, s3_env, s3_url, tmp_path):
    done = extract_s3(s3_url, tmp_path, s3_env, "runner=ray", "runner.num_replicas=2", env=RAY_ENV)
    assert done.returncode == 0, output(done)[-3000:]
    same_run(s3_url, local_run)
    assert open_store(s3_url).unfinished() == []


@pytest.fixture(scope="module")
def local_units(tmp_path_factory, models_root):
    return finished_run(tmp_path_factory, "local-units", *SMALL, *UNITS)


def units_per_node(log: str) -> dict[str, int]:
    line = re.search(r"units per Ray node: (.*)", log)
    assert line, log[-3000:]
    return {node: int(n) for node, n in (part.split(": ") for part in line.group(1).split(", "))}


@pytest.fixture
def cluster(s3_env):
    started = ray_cluster.start(s3_env.env, head_cpus=2, second_cpus=1)  # every node gets the credentials itself
    yield started
    started.stop()


def test_two_nodes_share_the_units_and_write_the_local_runs_bytes(cluster, local_units, s3_env, s3_url, tmp_path):
    done = extract_s3(s3_url, tmp_path, s3_env, "runner=ray", f"runner.address={cluster.address}",
                      "runner.num_replicas=2", *UNITS, env=cluster.env)
    assert done.returncode == 0, output(done)[-3000:]
    per_node = units_per_node(output(done))
    assert len(per_node) == 2 and sum(per_node.values()) == 10, per_node
    same_run(s3_url, local_units)
    assert open_store(s3_url).unfinished() == []


def test_a_node_lost_mid_run_leaves_the_run_to_finish_on_the_other(cluster, local_units, s3_env, s3_url, tmp_path):
    cmd_log = tmp_path / "extract.log"
    with open(cmd_log, "w") as log:
        proc = subprocess.Popen(
            extract_s3_cmd(s3_url, tmp_path, "runner=ray", f"runner.address={cluster.address}",
                           "runner.num_replicas=2", *UNITS), cwd=REPO, env=s3_run_env(s3_env, cluster.env),
            stdout=log, stderr=subprocess.STDOUT)
        store = open_store(s3_url)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None and \
                len([o for o in store.list("shards/") if o.key.endswith(".done.json")]) < 2:
            time.sleep(0.2)
        assert proc.poll() is None, cmd_log.read_text()[-3000:]
        cluster.lose_second_node()
        assert proc.wait(timeout=300) == 0, cmd_log.read_text()[-3000:]
    markers = [o.key for o in store.list("shards/") if o.key.endswith(".done.json")]
    assert len(markers) == 10
    same_run(s3_url, local_units)
    assert store.unfinished() == []
