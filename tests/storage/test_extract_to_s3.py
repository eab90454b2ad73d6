"""extract with `out_dir=s3://bucket/prefix`, against SeaweedFS on loopback: the run in the bucket is the same bytes
as the same command's run on disk, read back as a run; a kill -9 at a write step is resumed by the same command to
the same bytes with no upload left unfinished; one writer per prefix; bad locations refused in one line."""
from __future__ import annotations

import json
import subprocess
import sys
from functools import partial

import pytest

from pipeline.core.stores import open_store
from pipeline.core.storeclaim import StoreClaim
from pipeline.shards.reader import RunReader
from tests.helpers.runs import REPO, env_with, error_lines, output
from tests.helpers.s3_runs import extract_s3, finished_on, killed_then_resumed, same_run
from tests.helpers.sweep import sampled

# Each name is written twice on object storage: into the spool (#1), then to the store (#2).
STEPS = ["rename:run.json", "write:shard-00000.safetensors#2", "rename:shard-00000.safetensors#2",
         "rename:shard-00000.done.json#2", "write:attestation.intoto.json", "write:manifest.json",
         "rename:manifest.json"]
KILLS = ["write:shard-00000.safetensors#2", "rename:shard-00000.done.json#2", "write:manifest.json"]


def test_a_run_on_s3_is_the_local_runs_bytes_and_reads_as_a_run(local_run, s3_env, s3_url, tmp_path):
    done = extract_s3(s3_url, tmp_path, s3_env)
    finished_on(done, s3_url, tmp_path / "spool", "run")
    same_run(s3_url, local_run)
    store = open_store(s3_url)
    written = [store.get(o.key) for o in store.list()] + [p.read_bytes() for p in (tmp_path / "logs").rglob("*")
                                                          if p.is_file()] + [output(done).encode()]
    for secret in (s3_env.env["AWS_SECRET_ACCESS_KEY"], s3_env.env["AWS_ACCESS_KEY_ID"]):
        assert not [w for w in written if secret.encode() in w], "a credential in the run, its logs or its output"
    with RunReader(s3_url) as remote, RunReader(local_run) as local:
        assert remote.sample_ids == local.sample_ids
        for sample_id in local.sample_ids:
            assert remote[sample_id]["hidden_states"].equal(local[sample_id]["hidden_states"])
    again = extract_s3(s3_url, tmp_path, s3_env)
    assert again.returncode == 2 and "holds a finished run" in output(again)
    assert "prepared" not in output(again), "refused before the data is read or the model hashed"
    replaced = extract_s3(s3_url, tmp_path, s3_env, "overwrite=true")
    assert replaced.returncode == 0, output(replaced)[-3000:]
    same_run(s3_url, local_run)


def test_the_documented_command_writes_a_run_to_the_bucket(s3_env, tmp_path):
    """docs/how-to/object-storage.md, as written (the bucket `runs` is the server's)."""
    doc = ".venv/bin/python -m pipeline.extract out_dir=s3://runs/first gate.mode=off data.limit=6"
    done = subprocess.run(["bash", "-c", doc], cwd=REPO, env=env_with(**s3_env.env), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, output(done)[-3000:]
    assert "run directory: s3://runs/first" in done.stdout
    with RunReader("s3://runs/first") as run:
        assert len(run.sample_ids) == 6
    check = ".venv/bin/python -m pipeline.verify s3://runs/first"
    done = subprocess.run(["bash", "-c", check], cwd=REPO, env=env_with(**s3_env.env), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.startswith("sound: s3://runs/first: 1 shard(s), 6 samples"), \
        output(done)
    export = (  # verbatim, as the page's harness requires
        ".venv/bin/python -m pipeline.export s3://runs/first --format speculators --last final_norm --states reference --out first-export")  # noqa: E501
    (tmp_path / ".venv").symlink_to(REPO / ".venv")  # the page's relative paths, its export outside the checkout
    done = subprocess.run(["bash", "-c", export], cwd=tmp_path, env=env_with(**s3_env.env), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and "exported 6 samples to first-export" in done.stdout, output(done)
    assert json.loads((tmp_path / "first-export" / "export.json").read_text())["run_dir"] == "s3://runs/first"
    to_bucket = (  # verbatim
        ".venv/bin/python -m pipeline.export s3://runs/first --format speculators --last final_norm --states reference --out s3://runs/first-export")  # noqa: E501
    home = {"HOME": str(tmp_path / "home")}  # the default spool, under ~
    done = subprocess.run(["bash", "-c", to_bucket], cwd=tmp_path, env=env_with(**s3_env.env, **home),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "exported 6 samples to s3://runs/first-export" in done.stdout, output(done)
    sidecar = json.loads(open_store("s3://runs/first-export").get("export.json"))
    assert sidecar == json.loads((tmp_path / "first-export" / "export.json").read_text())  # no vocabulary: no path
    spool = tmp_path / "home" / ".cache" / "pipeline" / "spool"
    assert spool.is_dir() and not [p for p in spool.rglob("*") if p.is_file()], "the spool keeps nothing of it"


def verify_s3(url: str, server, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline.verify", url, *args], cwd=REPO,
                          env=env_with(**server.env), capture_output=True, text=True, timeout=300)


def test_verify_reads_every_byte_of_a_run_on_s3(local_run, s3_env, s3_url, tmp_path):
    """A run in a bucket verifies as on disk; a changed byte of a shard's states, or a user's object beside the run,
    is named; the scratch directory keeps nothing."""
    assert extract_s3(s3_url, tmp_path, s3_env).returncode == 0
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    sound = verify_s3(s3_url, s3_env, "--scratch", str(scratch))
    assert sound.returncode == 0, output(sound)
    assert list(scratch.iterdir()) == []
    store = open_store(s3_url)
    key = "shards/shard-00001.safetensors"
    data = bytearray(store.get(key))
    data[-1] ^= 1
    store.delete(key)
    store.put(key, bytes(data))
    store.put("shards/notes.txt", b"mine")
    store.put("shards/shard-00009.safetensors", b"a shard no manifest lists")
    broken = verify_s3(s3_url, s3_env)
    assert broken.returncode == 3
    assert f"shard-00001: {key} sha256" in broken.stderr and "shards/notes.txt" in broken.stderr
    assert "shards/shard-00009.safetensors" in broken.stderr
    assert str(tmp_path) not in broken.stderr and "staged-run" not in broken.stderr
    unfinished = verify_s3(s3_url + "-none", s3_env)
    assert unfinished.returncode == 2 and "manifest.json does not exist" in output(unfinished)


@pytest.mark.parametrize("step", sampled(STEPS, KILLS))
def test_a_kill_at_a_write_step_on_s3_is_resumed_to_the_same_bytes(local_run, s3_env, s3_url, tmp_path, step):
    resumed = killed_then_resumed(partial(extract_s3, s3_url, tmp_path, s3_env), s3_url, step, "run")
    if resumed is not None:
        finished_earlier = "(1 finished earlier)" in resumed.stdout
        assert finished_earlier == (step == "rename:shard-00000.done.json#2"), resumed.stdout
    same_run(s3_url, local_run)


def test_the_plan_of_a_run_on_s3_counts_the_buckets_units_and_checks_the_spools_room(s3_env, s3_url, tmp_path,
                                                                                      small_fs):
    killed = extract_s3(s3_url, tmp_path, s3_env, fault="kill@write:shard-00001.safetensors#2")  # shard 0 published
    assert killed.returncode == -9, output(killed)[-2000:]
    planned = extract_s3(s3_url, tmp_path, s3_env, "plan=true")
    assert planned.returncode == 0, output(planned)[-3000:]
    said = output(planned)
    assert f"plan for {s3_url}: 6 samples" in said and "in 2 shard(s); 1 shard(s)," in said, said
    assert "in the bucket in all" in said and "no size limit is checked on object storage; the spool" in said
    # one unit of 40 samples (~20 MB of states) cannot be staged in a 4 MiB spool: refused before any engine starts
    big = extract_s3(f"{s3_url}-big", tmp_path, s3_env, f"spool_dir={small_fs}", "data.limit=40",
                     "runner.max_tokens_per_shard=1000000")
    assert big.returncode == 2, output(big)[-3000:]
    (line,) = error_lines(big)
    assert f"spool_dir: {small_fs}/" in line and "for the units in flight" in line and "check_space=false" in line
    assert "Loading weights" not in output(big) and open_store(f"{s3_url}-big").list() == []


def test_a_prefix_another_extract_holds_is_refused_naming_the_holder(s3_env, s3_url, tmp_path):
    with StoreClaim(open_store(s3_url), ".lock"):
        done = extract_s3(s3_url, tmp_path, s3_env)
    assert done.returncode == 2
    (line,) = error_lines(done)
    assert f"out_dir='{s3_url}' is in use by pid" in line and "another extract is writing it" in line
    assert open_store(s3_url).head("run.json") is None


@pytest.mark.parametrize("case", ["no bucket", "wrong secret", "refused endpoint", "user's object",
                                  "password in the endpoint"])
def test_a_location_that_cannot_be_used_is_one_line_naming_it(case, s3_env, s3_url, tmp_path):
    url, env = s3_url, {}
    if case == "no bucket":
        url = s3_url.replace("s3://runs/", "s3://no-such-bucket/")
    elif case == "wrong secret":
        env = {"AWS_SECRET_ACCESS_KEY": "not-the-secret-0123456789"}
    elif case == "refused endpoint":
        env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
    elif case == "user's object":
        open_store(s3_url).put("notes.txt", b"mine")
    overrides = [f"s3_endpoint=http://me:not-the-secret-0123@{s3_env.env['AWS_ENDPOINT_URL'].split('//')[1]}"] \
        if case == "password in the endpoint" else []
    done = extract_s3(url, tmp_path, s3_env, *overrides, env=env)
    assert done.returncode == 2, output(done)[-3000:]
    (line,) = error_lines(done)
    assert (url.split("/")[2] in line or case == "password in the endpoint") and "Traceback" not in output(done)
    assert s3_env.env["AWS_SECRET_ACCESS_KEY"] not in output(done) and "not-the-secret" not in output(done)
    why = {"no bucket": "does not exist", "wrong secret": "refused the credentials",
           "refused endpoint": "does not answer", "user's object": "holds no run (notes.txt)",
           "password in the endpoint": "s3_endpoint holds a user name or password"}[case]
    assert why in line
    if case == "user's object":
        assert {o.key for o in open_store(s3_url).list()} - {".lock"} == {"notes.txt"}  # the user's object kept



def test_a_gate_stop_puts_its_report_in_the_bucket(s3_env, s3_url, tmp_path):
    """The gate's report is written in the driver's spool; when the gate stops a run on object storage, the report is
    put in the bucket too (a driver's pod may not outlive the stop), and a rerun whose gate passes replaces it."""
    stopped = extract_s3(s3_url, tmp_path, s3_env, "gate.mode=stop", "diff.thresholds.bfloat16.rel_l2=0")
    assert stopped.returncode == 3, output(stopped)[-3000:]
    assert f"the report is in {s3_url}/diff/ as well" in output(stopped)
    store = open_store(s3_url)
    keys = {o.key for o in store.list()}
    assert {"diff/report.json", "diff/report.md"} <= keys and not any(k.startswith("shards/") for k in keys), keys
    assert json.loads(store.get("diff/report.json"))["status"] == "fail"
    passed = extract_s3(s3_url, tmp_path, s3_env, "gate.mode=stop")
    assert passed.returncode == 0, output(passed)[-3000:]
    assert json.loads(store.get("diff/report.json"))["status"] != "fail" and store.head("manifest.json") is not None
