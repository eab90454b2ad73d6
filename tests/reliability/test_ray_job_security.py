"""The Ray job files turn on token authentication and publish no dashboard: the RayJob manifest parses and says so,
and jobs/submit.sh refuses to submit without a token or over plain http to another host; it waits for a cluster's job
agent that is not up yet (a bounded number of retries, each said), and retries nothing else."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.reliability
REPO = Path(__file__).resolve().parents[2]
SUBMIT = REPO / "jobs" / "submit.sh"


@pytest.mark.parametrize("manifest", ["kimi-rayjob.yaml", "kimi-rayjob-s3.yaml"])
def test_the_rayjob_turns_on_token_auth_and_keeps_the_dashboard_in_the_cluster(manifest):
    (job,) = yaml.safe_load_all((REPO / "jobs" / manifest).read_text())
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


class _Dashboard(BaseHTTPRequestHandler):
    """The job API of a cluster whose dashboard is up but whose job agent is not (yet): what Ray 2.60's dashboard
    answers then (`job_head.py`: 500, "No available agent to submit job, please try again later."), for the real
    `ray job submit` to meet. `replies` says how each POST /api/jobs/ is answered, in order (then the last again)."""

    replies: list[tuple[int, str]] = []
    posts: list[str] = []

    def _reply(self, code: int, body: str) -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 (http.server's names)
        if self.path.startswith("/api/version"):
            return self._reply(200, json.dumps({"version": "4", "ray_version": "2.60.0", "ray_commit": "x",
                                                "session_name": "s"}))
        return self._reply(404, "not found")  # the working directory's package: not uploaded yet

    def do_PUT(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._reply(200, "{}")

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).posts.append(self.path)
        self._reply(*self.replies[min(len(self.posts), len(self.replies)) - 1])

    def log_message(self, *args: object) -> None:
        pass


NO_AGENT = (500, "No available agent to submit job, please try again later.")


@pytest.fixture
def dashboard(tmp_path):
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("a-token")
    server = HTTPServer(("127.0.0.1", 0), _Dashboard)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Dashboard.posts = []
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    thread.join()


def test_submit_waits_for_the_job_agent_a_bounded_number_of_times_and_says_so(tmp_path, dashboard):
    _Dashboard.replies = [NO_AGENT]
    proc = _submit(tmp_path, RAY_ADDRESS=dashboard, PIPELINE_SUBMIT_ATTEMPTS="3", PIPELINE_SUBMIT_RETRY_SECONDS="0")
    assert proc.returncode == 1 and len(_Dashboard.posts) == 3, proc.stderr[-3000:]
    retries = [line for line in proc.stderr.splitlines() if "retrying in" in line]
    assert retries == [f"submit.sh: the cluster's job agent is not up yet (Ray: \"No available agent to submit job\"; "
                       f"nothing was submitted); retrying in 0s (attempt {n} of 3)" for n in (2, 3)]
    assert proc.stderr.count("Request failed with status code 500: No available agent") == 1  # the last attempt's
    assert proc.stderr.splitlines()[-1].startswith("submit.sh: still no job agent after 3 attempts")


def test_submit_retries_only_the_missing_agent(tmp_path, dashboard):
    _Dashboard.replies = [NO_AGENT, (400, "entrypoint is not valid")]
    proc = _submit(tmp_path, RAY_ADDRESS=dashboard, PIPELINE_SUBMIT_RETRY_SECONDS="0")
    assert proc.returncode == 1 and len(_Dashboard.posts) == 2, proc.stderr[-3000:]
    assert sum("retrying in" in line for line in proc.stderr.splitlines()) == 1
    assert "Request failed with status code 400: entrypoint is not valid" in proc.stderr
    assert "still no job agent" not in proc.stderr


def test_the_object_storage_rayjob_gives_every_node_credentials_from_a_secret_never_in_the_job():
    (job,) = yaml.safe_load_all((REPO / "jobs" / "kimi-rayjob-s3.yaml").read_text())
    spec, cluster = job["spec"], job["spec"]["rayClusterSpec"]
    assert "out_dir=s3://" in spec["entrypoint"] and "AWS" not in spec["entrypoint"] + spec["runtimeEnvYAML"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for container in (c for g in groups for c in g["template"]["spec"]["containers"]):
        env = {e["name"]: e for e in container["env"]}
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            assert "value" not in env[name] and env[name]["valueFrom"]["secretKeyRef"]["name"] == "eagle3-s3"
        assert any(m["mountPath"] == "/spool" for m in container["volumeMounts"])
        assert not any(v.get("persistentVolumeClaim") and not v["persistentVolumeClaim"].get("readOnly")
                       for g in groups for v in g["template"]["spec"]["volumes"])
