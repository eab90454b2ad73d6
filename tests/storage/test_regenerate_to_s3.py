"""regenerate with `out_dir=s3://bucket/prefix`, and extract with `data.path` in the bucket, against SeaweedFS on
loopback: the regeneration in the bucket is the local one's bytes; extract reads it (and a prompt file in the bucket)
into the same shards as from disk; a kill -9 at a write step is resumed to the same bytes with no upload left
unfinished."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from safetensors import safe_open

from pipeline.core.stores import open_store
from tests.helpers import REPO
from tests.helpers.runs import env_with, output
from tests.helpers.s3_runs import files, finished_on, killed_then_resumed, objects
from tests.helpers.sweep import sampled

# Two parts of two conversations on the tiny Llama, greedy (as tests/reliability/test_regen_reliability.py).
SMALL = ("model=tiny_llama", "data.limit=4", "runner.max_samples_per_shard=2", "sampling.max_tokens=4")
# What depends on where and when it was written: the lease; the manifest's time and config (compared without them).
PLACE_BOUND = {".lock", "manifest.json"}
# Each part's files are written twice on object storage: into the spool (#1), then to the store (#2).
STEPS = ["write:regen.json", "write:part-00000.parquet#2", "rename:part-00000.parquet#2",
         "write:part-00000.done.json#2", "rename:part-00000.done.json#2", "write:part-00001.parquet#2",
         "write:rejects.parquet#2", "write:manifest.json", "rename:manifest.json"]
KILLS = ["write:part-00000.parquet#2", "rename:part-00000.done.json#2", "write:manifest.json"]


def regenerate(out: str | Path, tmp: Path, server, *overrides: str, fault: str | None = None):
    """`server` None: a regeneration on disk, with no S3 endpoint or credentials at all."""
    cmd = [sys.executable, "-m", "pipeline.regenerate", f"out_dir={out}", f"hydra.run.dir={tmp}/logs",
           f"spool_dir={tmp}/spool", *SMALL, *overrides]
    env = env_with(**(server.env if server else {}), **({"PIPELINE_FAULT": fault} if fault else {}))
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def extract(data: str | Path, out: Path, server, *overrides: str):
    cmd = [sys.executable, "-m", "pipeline.extract", "model=tiny_llama", f"data.path={data}", f"out_dir={out}",
           f"hydra.run.dir={out}.logs", f"spool_dir={out.parent}/spool", "gate.mode=off", *overrides]
    return subprocess.run(cmd, cwd=REPO, env=env_with(**server.env), capture_output=True, text=True, timeout=600)


def _manifest(data: bytes) -> dict:
    manifest = json.loads(data)
    manifest["provenance"].pop("created_utc")
    manifest["provenance"].pop("config")
    return manifest


def same_regeneration(url: str, local: Path) -> None:
    there, here = objects(url), files(local)
    assert there.keys() == here.keys()
    differ = sorted(k for k in there if k not in PLACE_BOUND and there[k] != here[k])
    assert not differ, f"objects of {url} that are not the local regeneration's bytes: {differ}"
    assert _manifest(open_store(url).get("manifest.json")) == _manifest((local / "manifest.json").read_bytes())


@pytest.fixture(scope="module")
def local_regen(tmp_path_factory, models_root) -> Path:
    tmp = tmp_path_factory.mktemp("local-regen")
    done = regenerate(tmp / "regen", tmp, None)
    assert done.returncode == 0, output(done)[-3000:]
    return tmp / "regen"


def test_a_regeneration_on_s3_is_the_local_ones_bytes_and_extract_reads_it(local_regen, s3_env, s3_url, tmp_path):
    done = regenerate(s3_url, tmp_path, s3_env)
    finished_on(done, s3_url, tmp_path / "spool", "regeneration")
    same_regeneration(s3_url, local_regen)
    checked = verify(s3_url, s3_env)
    assert checked.returncode == 0 and checked.stdout.startswith(f"sound: {s3_url}: regeneration"), output(checked)
    again = regenerate(s3_url, tmp_path, s3_env)
    assert again.returncode == 2 and "holds a finished regeneration" in output(again), output(again)[-2000:]
    assert "to regenerate from" not in output(again), "refused before the prompts are read or the model hashed"

    on_answers = extract(s3_url, tmp_path / "on-answers", s3_env)  # the regeneration written to the bucket
    assert on_answers.returncode == 0, output(on_answers)[-3000:]
    manifest = json.loads((tmp_path / "on-answers" / "manifest.json").read_text())
    assert manifest["num_samples"] == len(local_regen_turns(local_regen))
    assert manifest["provenance"]["config"]["data"]["path"] == s3_url, "the run records the data as given"


def test_a_regeneration_copied_to_a_bucket_is_read_as_the_one_on_disk(local_regen, s3_env, s3_url, tmp_path):
    """The same regeneration (a local one uploaded as `aws s3 cp --recursive` would) gives the same samples, ids and
    states from the bucket as from the disk."""
    upload(local_regen, s3_url)
    named = tmp_path / s3_url.rsplit("/", 1)[1]  # a run names its data source by the last component of data.path
    shutil.copytree(local_regen, named)
    from_disk = extract(named, tmp_path / "from-disk", s3_env)
    from_bucket = extract(s3_url, tmp_path / "from-bucket", s3_env)
    assert from_disk.returncode == 0 and from_bucket.returncode == 0, output(from_bucket)[-3000:]
    same_shards(tmp_path / "from-disk", tmp_path / "from-bucket")


def test_verify_reads_every_byte_of_a_regeneration_in_a_bucket(local_regen, s3_env, s3_url, tmp_path):
    store = upload(local_regen, s3_url)
    done = verify(s3_url, s3_env)
    assert done.returncode == 0 and done.stdout.startswith(f"sound: {s3_url}: regeneration of 4 records"), \
        output(done)
    keyed = verify(s3_url, s3_env, "--key", str(tmp_path / "k.pem"))
    assert keyed.returncode == 2 and "is a regeneration directory, which carries no signature" in keyed.stderr
    part = store.get("records/part-00001.parquet")
    store.put("records/part-00001.parquet", part[:-9] + bytes(9))  # the same size, other bytes
    store.put("records/notes.txt", b"a user's object")
    done = verify(s3_url, s3_env)
    assert done.returncode == 3, output(done)
    assert "records/part-00001.parquet: sha256 differs from the manifest's" in done.stderr
    assert "records/notes.txt: not a file a regeneration writes" in done.stderr
    assert done.stderr.splitlines()[-1].endswith(f"problem(s) in {s3_url}"), done.stderr
    store.delete("manifest.json")
    done = verify(s3_url, s3_env)
    assert done.returncode == 2 and f"{s3_url} is an unfinished regeneration" in done.stderr, output(done)


def upload(local: Path, url: str):
    """`local` copied into the bucket object by object, as `aws s3 cp --recursive` would (its lease left out)."""
    store = open_store(url)
    for path in sorted(p for p in local.rglob("*") if p.is_file() and p.name != ".lock"):
        store.put(path.relative_to(local).as_posix(), path.read_bytes())
    return store


def verify(url: str, server, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline.verify", url, *args], cwd=REPO,
                          env=env_with(**server.env), capture_output=True, text=True, timeout=300)


def local_regen_turns(root: Path) -> list:
    return [turn for part in json.loads((root / "manifest.json").read_text())["parts"]
            for row in pq.read_table(root / part["file"]).to_pylist() for turn in row["turns"]]


def same_shards(a: Path, b: Path) -> None:
    """The runs hold the same samples, ids and states (their shards' metadata differ only by the provenance digest:
    the config records data.path as given)."""
    names = sorted(p.name for p in (a / "shards").glob("*.safetensors"))
    assert names and names == sorted(p.name for p in (b / "shards").glob("*.safetensors"))
    for name in names:
        assert pq.read_table(a / "shards" / name.replace(".safetensors", ".parquet")).equals(
            pq.read_table(b / "shards" / name.replace(".safetensors", ".parquet")))
        with safe_open(a / "shards" / name, "pt") as x, safe_open(b / "shards" / name, "pt") as y:
            assert {**x.metadata(), "provenance_digest": ""} == {**y.metadata(), "provenance_digest": ""}
            assert x.keys() == y.keys() and all(x.get_tensor(k).equal(y.get_tensor(k)) for k in x.keys())


def test_a_prompt_file_in_a_bucket_is_read_as_the_file_on_disk(local_regen, s3_env, s3_url, tmp_path):
    prompts = REPO / "pipeline" / "data" / "bundled" / "conversations.jsonl"
    store = open_store(s3_url)
    store.put("conversations.jsonl", prompts.read_bytes())
    from_disk = extract(prompts, tmp_path / "from-disk", s3_env, "data.limit=4")
    from_bucket = extract(f"{s3_url}/conversations.jsonl", tmp_path / "from-bucket", s3_env, "data.limit=4")
    assert from_disk.returncode == 0 and from_bucket.returncode == 0, output(from_bucket)[-3000:]
    same_shards(tmp_path / "from-disk", tmp_path / "from-bucket")
    url = f"{s3_url}/conversations.jsonl"
    regen = regenerate(tmp_path / "regen", tmp_path, s3_env, f"data.path={url}")  # regenerate reads it the same way
    assert regen.returncode == 0, output(regen)[-3000:]
    parts = {k: v for k, v in files(tmp_path / "regen").items() if k.startswith("records/")}
    assert parts and parts == {k: v for k, v in files(local_regen).items() if k.startswith("records/")}
    diff = subprocess.run([sys.executable, "-m", "pipeline.diff", "model=tiny_llama", f"data.path={url}",
                           f"out_dir={tmp_path / 'report'}", f"hydra.run.dir={tmp_path}/diff-logs",
                           f"spool_dir={tmp_path}/spool"], cwd=REPO, env=env_with(**s3_env.env), capture_output=True,
                          text=True, timeout=600)
    assert diff.returncode == 0, output(diff)[-3000:]
    assert json.loads((tmp_path / "report" / "report.json").read_text())["probe"]["samples"]
    missing = extract(f"{s3_url}/nothing.jsonl", tmp_path / "missing", s3_env)
    assert missing.returncode == 2 and f"data.path='{s3_url}/nothing.jsonl': there is no such object" in \
        output(missing), output(missing)[-2000:]
    assert not (tmp_path / "missing").exists()


def test_an_unfinished_regeneration_in_a_bucket_is_refused_as_data(s3_env, s3_url, tmp_path):
    killed = regenerate(s3_url, tmp_path, s3_env, fault="kill@write:part-00001.parquet#2")
    assert killed.returncode == -9, output(killed)[-2000:]
    done = extract(s3_url, tmp_path / "run", s3_env)
    assert done.returncode == 2 and "holds an unfinished regeneration (no manifest.json)" in output(done), \
        output(done)[-2000:]
    assert "Traceback" not in output(done) and not (tmp_path / "run").exists()


@pytest.mark.parametrize("step", sampled(STEPS, KILLS))
def test_a_kill_at_a_write_step_on_s3_is_resumed_to_the_same_bytes(local_regen, s3_env, s3_url, tmp_path, step):
    killed_then_resumed(partial(regenerate, s3_url, tmp_path, s3_env), s3_url, step, "regeneration")
    same_regeneration(s3_url, local_regen)


def test_the_documented_commands_regenerate_into_the_bucket_and_extract_from_it(s3_env, tmp_path):
    """docs/how-to/object-storage.md, as written (the bucket `runs` is the server's)."""
    regen = ".venv/bin/python -m pipeline.regenerate out_dir=s3://runs/answers data.limit=4 sampling.max_tokens=8"
    run = ".venv/bin/python -m pipeline.extract data.path=s3://runs/answers out_dir=s3://runs/on-answers gate.mode=off"
    for command, said in ((regen, "regeneration directory: s3://runs/answers"),
                          (run, "run directory: s3://runs/on-answers")):
        done = subprocess.run(["bash", "-c", command], cwd=REPO, env=env_with(**s3_env.env, HOME=str(tmp_path)),
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0 and said in done.stdout, output(done)[-3000:]
    manifest = json.loads(open_store("s3://runs/on-answers").get("manifest.json"))
    assert manifest["num_samples"] > 0 and manifest["provenance"]["data"]["regeneration"]["manifest_sha256"]
