"""The Ray runner writing to object storage (SeaweedFS on loopback): each replica publishes its own units, and the
run in the bucket is the local runner's on disk, byte for byte. Its own module: it starts a Ray cluster, so it runs in
the engine stream (tests/conftest.py)."""
from __future__ import annotations

from pipeline.core.stores import open_store
from tests.helpers.runs import output
from tests.helpers.s3_runs import extract_s3, same_run


def test_ray_replicas_publish_their_own_units_to_the_same_bytes(local_run, s3_env, s3_url, tmp_path):
    done = extract_s3(s3_url, tmp_path, s3_env, "runner=ray", "runner.num_replicas=2",
                      env={"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"})
    assert done.returncode == 0, output(done)[-3000:]
    same_run(s3_url, local_run)
    assert open_store(s3_url).unfinished() == []
