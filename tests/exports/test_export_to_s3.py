"""`pipeline.export RUN --out s3://bucket/prefix` (SeaweedFS on loopback): the export in the bucket is the export on disk
(every object the local file's bytes; export.json differing only where it names the export: the trainer's vocabulary
arguments), nothing visible as finished before export.json, a rerun finds it complete, a kill -9 at a write step
resumes to the same bytes with no multipart upload left, a second export on the prefix is refused naming the holder,
a prefix holding a user's object or a missing bucket is refused in one line, and the readers take it where it is: the
doctor and `pipeline.accept --export` read its export.json from the bucket, the trainer's wrapper a local copy (the
trainer training from a bucket export: tests/exports/test_reference_export.py)."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.exports.conftest import REPO, cli
from tests.helpers.drafts import accept_prepared
from tests.helpers.s3_runs import files, objects
from tests.helpers.seaweed import SECRET
from tests.helpers.sweep import sampled

from pipeline.core.stores import open_store
from pipeline.drafts.target import gather
from pipeline.trainers.speculators import prepared_argv

pytestmark = pytest.mark.integration
NOT_READ = {".export.lock"}  # the lease: on a store only, left out of the trainer's copy


def _export(run: Path | str, out: Path | str, spool: Path, *extra: str, env: dict | None = None):
    return cli("pipeline.export", str(run), "--format", "speculators", "--out", str(out), "--draft-vocab", "64",
               "--spool-dir", str(spool), *extra, env=env)


def _ok(proc) -> str:
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said[-3000:]
    assert SECRET not in said
    return said


def _same_export(url: str, local: Path) -> None:
    """The objects at `url` are the local export's files; export.json equal but for where it names the export."""
    there, here = objects(url), files(local)
    assert set(there) - NOT_READ == set(here) and len(here) >= 7  # 12 samples more in a full copy
    assert {k: v for k, v in there.items() if k not in NOT_READ | {"export.json"}} == \
        {k: v for k, v in here.items() if k != "export.json"}
    bucket = json.loads(open_store(url).get("export.json"))
    disk = json.loads((local / "export.json").read_text())
    assert bucket["draft_vocab"].pop("trainer_args") == \
        disk["draft_vocab"].pop("trainer_args").replace(str(local.resolve()), url)
    assert bucket == disk


def test_an_export_to_a_bucket_is_the_export_on_disk(llama_run, s3_url, tmp_path):
    _ok(_export(llama_run, tmp_path / "disk", tmp_path / "spool"))
    said = _ok(_export(llama_run, s3_url, tmp_path / "spool"))
    assert f"exported 12 samples to {s3_url}" in said
    _same_export(s3_url, tmp_path / "disk")
    assert open_store(s3_url).unfinished() == [] and not any((tmp_path / "spool").rglob("*.safetensors"))
    again = _ok(_export(llama_run, s3_url, tmp_path / "spool"))
    assert f"already complete: {s3_url}" in again
    # the readers: the doctor (and accept, through the same reader) read export.json where it is
    disk, bucket = gather(run=None, export=tmp_path / "disk", model_dir=None), gather(run=None, export=s3_url,
                                                                                      model_dir=None)
    assert bucket.features.aux == disk.features.aux and bucket.features.last == disk.features.last
    assert bucket.model_dir == disk.model_dir and bucket.sources[-1] == f"export {s3_url}"


def test_the_trainer_reads_a_bucket_export_from_a_local_copy(llama_run, s3_url, tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_SPOOL_DIR", str(tmp_path / "copies"))
    _ok(_export(llama_run, tmp_path / "disk", tmp_path / "spool", "--states", "reference"))
    _ok(_export(llama_run, s3_url, tmp_path / "spool", "--states", "reference"))
    _same_export(s3_url, tmp_path / "disk")
    sidecar = json.loads(open_store(s3_url).get("export.json"))
    open_store(s3_url).put("notes.txt", b"a user's, put there after the export finished: not the trainer's")
    argv = prepared_argv(["--data-path", s3_url, *sidecar["draft_vocab"]["trainer_args"].split()])
    local = Path(argv[1])
    assert local.is_dir() and local.is_relative_to(tmp_path / "copies") and (local / "export.json").is_file()
    assert files(local) == {k: v for k, v in files(tmp_path / "disk").items() if k != "export.json"} | \
        {"export.json": hashlib.sha256(open_store(s3_url).get("export.json")).hexdigest()}
    assert argv[4:8] == ["--d2t-path", str(local / "d2t-64.npy"), "--t2d-path", str(local / "t2d-64.npy")]
    assert argv[-2:] == ["--hidden-states-backend", "pipeline-run"]  # a reference export: as on disk
    with pytest.raises(SystemExit, match=rf"--data-path {s3_url}-none holds no finished export"):
        prepared_argv(["--data-path", f"{s3_url}-none"])


def test_what_a_bucket_prefix_must_hold_to_take_an_export(llama_run, s3_url, tmp_path):
    (tmp_path / "a-file").write_text("")
    proc = _export(llama_run, s3_url, tmp_path / "a-file" / "spool")
    line = (proc.stdout + proc.stderr).strip().splitlines()[-1]
    assert proc.returncode == 2 and f"--spool-dir '{tmp_path / 'a-file' / 'spool'}'" in line, proc.stderr[-2000:]
    store = open_store(s3_url)
    assert store.list() == []
    store.put("notes.txt", b"a user's")
    proc = _export(llama_run, s3_url, tmp_path / "spool")
    line = (proc.stdout + proc.stderr).strip().splitlines()[-1]
    assert proc.returncode == 2 and s3_url in line and "notes.txt" in line, proc.stderr[-2000:]
    assert [o.key for o in store.list()] == ["notes.txt"]
    proc = _export(llama_run, "s3://no-such-bucket-here/x", tmp_path / "spool")
    assert proc.returncode == 2 and "no-such-bucket-here" in proc.stderr.strip().splitlines()[-1], proc.stderr


STEPS = [".export-plan.json", "hs_0.safetensors#2", "hs_3.safetensors#2", "hs_11.safetensors#2",
         "data-00000-of-00001.arrow#2", "d2t-64.npy#2", "export.json"]


@pytest.mark.parametrize("step", sampled([f"{phase}:{name}" for name in STEPS for phase in ("write", "rename")],
                                         ["rename:hs_3.safetensors#2", "write:d2t-64.npy#2", "rename:export.json"]))
def test_a_bucket_export_killed_at_a_write_step_resumes_to_the_same_bytes(llama_run, s3_url, tmp_path, step):
    _ok(_export(llama_run, tmp_path / "disk", tmp_path / "spool"))
    killed = _export(llama_run, s3_url, tmp_path / "spool", env={**os.environ, "PIPELINE_FAULT": f"kill@{step}"})
    assert killed.returncode == -9, killed.stderr[-2000:]
    store = open_store(s3_url)
    assert (store.head("export.json") is None) == (step != "rename:export.json")
    resumed = _ok(_export(llama_run, s3_url, tmp_path / "spool"))
    assert ("already complete" in resumed) == (step == "rename:export.json")
    assert store.unfinished() == []
    if step == "rename:export.json":  # killed before the plan's removal: the finished export keeps it, as on disk
        store.delete(".export-plan.json")
    _same_export(s3_url, tmp_path / "disk")



def test_accept_and_the_doctor_take_the_export_in_the_bucket(llama_run, models_root, s3_url, tmp_path):
    """`pipeline.accept --export s3://...` settles each draft's verdict from the bucket's export.json before any engine
    starts (as tests/exports/test_accept_export.py on disk), and `pipeline.doctor --export s3://...` says the same."""
    _ok(_export(llama_run, s3_url, tmp_path / "spool", "--states", "reference"))
    ids = json.loads(open_store(s3_url).get("export.json"))["serving"]["vllm"]["aux_layer_ids"]
    plan, wired, shifted = accept_prepared(tmp_path, models_root, ids, export=s3_url)
    assert plan.model_dir.resolve() == (models_root / "tiny-llama").resolve()
    assert [d.verdict for d in plan.doctors] == ["OK", "MISMATCH"], plan.doctors
    for draft, code in ((wired, 0), (shifted, 3)):
        proc = cli("pipeline.doctor", "--draft", str(draft), "--serve", "vllm", "--export", s3_url, "--no-load")
        assert proc.returncode == code, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert SECRET not in proc.stdout + proc.stderr
    proc = cli("pipeline.doctor", "--draft", str(wired), "--serve", "vllm", "--export", f"{s3_url}-none", "--no-load")
    line = (proc.stdout + proc.stderr).strip().splitlines()[-1]
    assert proc.returncode == 2 and f"{s3_url}-none/export.json is missing" in line, proc.stderr[-2000:]


def test_two_exports_to_one_prefix_one_writes_the_other_is_refused(llama_run, s3_url, tmp_path):
    go = tmp_path / "go"
    cmd = [sys.executable, "-m", "pipeline.export", str(llama_run), "--format", "speculators", "--out", s3_url,
           "--spool-dir", str(tmp_path / "spool")]
    first = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "PIPELINE_FAULT": f"pause={go}@write:hs_3.safetensors"},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        store = open_store(s3_url)
        deadline = time.monotonic() + 120
        while store.head("hidden_states/hs_2.safetensors") is None:
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.2)
        second = cli("pipeline.export", str(llama_run), "--format", "speculators", "--out", s3_url, "--spool-dir",
                     str(tmp_path / "spool2"))
        line = second.stderr.strip().splitlines()[-1]
        assert second.returncode == 2 and f"--out {s3_url} is in use by" in line and "another export" in line, line
    finally:
        go.touch()
        out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-2000:]
    assert store.head("export.json") is not None
