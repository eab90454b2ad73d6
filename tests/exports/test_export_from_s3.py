"""A run on object storage exports, reads and is diagnosed as the same run on disk (SeaweedFS on loopback): the
export of `s3://...` holds the same bytes as the export of the local run (its export.json differing only in the run's
name and fingerprints), a reference export's samples read from the bucket equal the local run's, an object rewritten
or removed since the export is refused at the trainer's start, a bucket run that does not verify is not exported, and
the doctor reads the run's manifest from the bucket. (The trainer's own CLI training from the bucket:
tests/exports/test_reference_export.py.)"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from tests.exports.conftest import cli
from tests.helpers.seaweed import SECRET, upload_run

from pipeline.core.stores import open_store
from pipeline.drafts.target import gather
from pipeline.exports.run_states import RunStates, RunStatesError

pytestmark = pytest.mark.integration


def _export(run: Path | str, out: Path, *extra: str) -> None:
    proc = cli("pipeline.export", str(run), "--format", "speculators", "--out", str(out), "--draft-vocab", "64",
               *extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert SECRET not in proc.stdout + proc.stderr


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_export_of_a_run_in_a_bucket_is_the_export_of_the_run_on_disk(llama_run, s3_url, tmp_path):
    upload_run(llama_run, s3_url)
    _export(llama_run, tmp_path / "disk")
    _export(s3_url, tmp_path / "bucket")
    disk, bucket = _files(tmp_path / "disk"), _files(tmp_path / "bucket")
    # each sidecar names its own export directory (the trainer's vocabulary arguments): read as the disk one's
    sidecars = json.loads(disk.pop("export.json")), json.loads(bucket.pop("export.json").replace(
        str(tmp_path / "bucket").encode(), str(tmp_path / "disk").encode()))
    assert bucket.keys() == disk.keys() and len(disk) > 12 and bucket == disk  # every sample file, the same bytes
    assert sidecars[1]["run_dir"] == s3_url and sidecars[0]["run_dir"] == str(llama_run.resolve())
    assert {k: v for k, v in sidecars[1].items() if k != "run_dir"} == \
        {k: v for k, v in sidecars[0].items() if k != "run_dir"}  # the same run: manifest sha256, attestation, plan


def test_a_reference_export_reads_its_samples_from_the_bucket(llama_run, s3_url, tmp_path):
    upload_run(llama_run, s3_url)
    _export(llama_run, tmp_path / "disk", "--states", "reference")
    _export(s3_url, tmp_path / "bucket", "--states", "reference")
    sidecar = json.loads((tmp_path / "bucket" / "export.json").read_text())
    listing = {o.key: o for o in open_store(s3_url).list()}
    assert sidecar["run_files"] == {rel: {"bytes": listing[rel].size, "etag": listing[rel].etag}
                                    for rel in sidecar["run_files"]}
    assert SECRET not in (tmp_path / "bucket" / "export.json").read_text()
    disk, bucket = RunStates(tmp_path / "disk"), RunStates(tmp_path / "bucket")
    assert bucket.check()["run_dir"] == s3_url and len(bucket) == len(disk) == 12
    for i in range(len(disk)):
        here, there = disk.sample(i), bucket.sample(i)
        assert there["hidden_states"].dtype == here["hidden_states"].dtype == torch.bfloat16
        assert torch.equal(there["hidden_states"], here["hidden_states"]), i
        assert torch.equal(there["token_ids"], here["token_ids"]), i


def test_an_object_changed_since_the_export_is_refused_at_the_start(llama_run, s3_url, tmp_path):
    upload_run(llama_run, s3_url)
    _export(s3_url, tmp_path / "ref", "--states", "reference")
    store, states = open_store(s3_url), RunStates(tmp_path / "ref")
    states.check()
    manifest = json.loads((llama_run / "manifest.json").read_text())
    rel = next(r for r in manifest["shards"][1]["files"] if r.endswith(".safetensors"))
    data = bytearray(store.get(rel))
    data[-1] ^= 1  # the same size, other bytes: another version (ETag)
    store.delete(rel)
    store.put(rel, bytes(data))
    with pytest.raises(RunStatesError, match=rf"{re.escape(f'{s3_url}/{rel}')} was modified after"):
        states.check()
    store.delete(rel)
    store.put(rel, bytes(data[:-1]))
    with pytest.raises(RunStatesError, match=rf"{re.escape(f'{s3_url}/{rel}')} is {len(data) - 1} bytes, {len(data)} "):
        states.check()
    store.delete(rel)
    with pytest.raises(RunStatesError, match=rf"{re.escape(f'{s3_url}/{rel}')} is missing"):
        states.check()
    store.delete("manifest.json")
    with pytest.raises(RunStatesError, match=rf"its run {re.escape(s3_url)} is gone"):
        states.check()


def test_a_bucket_run_that_does_not_verify_is_not_exported(llama_run, s3_url, tmp_path):
    upload_run(llama_run, s3_url)
    store = open_store(s3_url)
    manifest = json.loads((llama_run / "manifest.json").read_text())
    rel = next(r for r in manifest["shards"][0]["files"] if r.endswith(".parquet"))
    data = bytearray(store.get(rel))
    data[len(data) // 2] ^= 1
    store.delete(rel)
    store.put(rel, bytes(data))
    proc = cli("pipeline.export", s3_url, "--format", "speculators", "--out", str(tmp_path / "x"))
    assert proc.returncode == 3, proc.stderr[-3000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert f"run {s3_url} does not verify" in line and rel in line and "Traceback" not in proc.stderr
    assert not (tmp_path / "x").exists()


def test_the_doctor_reads_the_run_from_the_bucket(llama_run, s3_url, tmp_path):
    upload_run(llama_run, s3_url)
    disk, bucket = gather(run=llama_run, export=None, model_dir=None), gather(run=s3_url, export=None, model_dir=None)
    for field in ("model_type", "architecture", "num_layers", "hidden_size", "engine", "vocab_size", "model_dir"):
        assert getattr(bucket, field) == getattr(disk, field), field
    assert bucket.features.run_points == disk.features.run_points and bucket.num_layers == 6
    assert bucket.sources == [f"run {s3_url}"]
    _export(s3_url, tmp_path / "ref", "--states", "reference")
    through_export = gather(run=None, export=tmp_path / "ref", model_dir=None)
    assert f"run {s3_url}" in through_export.sources and through_export.engine == disk.engine
