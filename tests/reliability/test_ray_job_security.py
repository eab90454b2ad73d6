"""The Ray job files turn on token authentication and publish no dashboard: the RayJob manifest parses and says so,
and jobs/submit.sh refuses to submit without a token or over plain http to another host."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.reliability
REPO = Path(__file__).resolve().parents[2]
SUBMIT = REPO / "jobs" / "submit.sh"


def test_the_rayjob_turns_on_token_auth_and_keeps_the_dashboard_in_the_cluster():
    (job,) = yaml.safe_load_all((REPO / "jobs" / "kimi-rayjob.yaml").read_text())
    cluster = job["spec"]["rayClusterSpec"]
    assert job["kind"] == "RayJob" and cluster["authOptions"] == {"mode": "token"}
    head = cluster["headGroupSpec"]
    assert head["serviceType"] == "ClusterIP" and head["enableIngress"] is False
    containers = [c for group in [head, *cluster["workerGroupSpecs"]] for c in group["template"]["spec"]["containers"]]
    assert not any(env.get("name") == "RAY_AUTH_MODE" for c in containers for env in c.get("env", []))  # operator's


def _submit(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "PIPELINE_ALLOW"))}
    path = f"{Path(sys.executable).parent}:{clean.get('PATH', '')}"  # the real `ray` CLI of this environment
    return subprocess.run(["bash", str(SUBMIT), "gate.mode=off"], env={**clean, "HOME": str(tmp_path), "PATH": path,
                                                                       **env},
                          capture_output=True, text=True, timeout=120)


def test_submit_refuses_plain_http_to_another_host(tmp_path):
    proc = _submit(tmp_path, RAY_ADDRESS="http://10.1.2.3:8265", RAY_AUTH_TOKEN="x")
    assert proc.returncode == 2
    assert "RAY_ADDRESS=http://10.1.2.3:8265 is a dashboard on another host over plain http" in proc.stderr
    assert "kubectl port-forward" in proc.stderr


def test_submit_refuses_to_run_without_a_token(tmp_path):
    proc = _submit(tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith("submit.sh: no Ray auth token: set RAY_AUTH_TOKEN, or write the cluster's token to "
                                  f"{tmp_path}/.ray/auth_token")


def test_submit_with_a_token_goes_to_the_forwarded_dashboard(tmp_path):
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("a-token")
    proc = _submit(tmp_path, RAY_ADDRESS="http://127.0.0.1:9")  # nothing listens there: ray's own connection error
    assert proc.returncode != 0 and "submit.sh:" not in proc.stderr
    assert "127.0.0.1:9" in proc.stdout + proc.stderr
