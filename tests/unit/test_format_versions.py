"""Every format version still reads: runs written by the version-1 code (tests/data/run-format-1, made by commit
b7498a0) and by the version-2 code (tests/data/run-format-2, made by commit 6f38cdb), each with `model=tiny_llama
data.limit=2 data.max_length=48 gate.mode=off runner.max_samples_per_shard=1`, verify, read and export with today's
code, and a run written today says version 3."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from safetensors import safe_open
from safetensors.torch import save_file

from pipeline.core.io import sha256_file

from pipeline.exports.driver import export_run
from pipeline.exports.formats import exporter_for
from pipeline.shards import layout
from pipeline.shards.manifest import ManifestError, read_manifest
from pipeline.shards.reader import RunReader
from pipeline.shards.verify import verify_run
from tests.helpers.shards import make_run

DATA = Path(__file__).resolve().parents[1] / "data"
STORED = ("1", "2")  # the versions of the stored runs, tests/data/run-format-<version>


def _copy(version: str, tmp_path: Path) -> Path:
    run = tmp_path / f"run-{version}"
    shutil.copytree(DATA / f"run-format-{version}", run)
    return run


@pytest.fixture
def v1_run(tmp_path):
    return _copy("1", tmp_path)


@pytest.mark.parametrize("version", STORED)
def test_a_stored_run_verifies_and_reads(tmp_path, version):
    run = _copy(version, tmp_path)
    assert json.loads((run / "manifest.json").read_text())["format_version"] == version
    assert verify_run(run) == []
    with RunReader(run) as reader:
        samples = list(reader.iter_samples())
    assert [s["hidden_states"].shape[1:] for s in samples] == [(5, 256)] * 2
    assert sum(s["input_ids"].numel() for s in samples) == 96
    assert read_manifest(run)["storage"]["scaling"] == "none"


@pytest.mark.parametrize("version", STORED)
def test_a_stored_runs_token_digests_keep_their_own_versions_definition(tmp_path, version):
    """Versions 1 and 2 digest the token ids alone, so a moved loss-mask token (count kept, checksums recomputed) is
    beyond what their files let verify recompute; version 3's digest covers it (tests/reliability)."""
    run = _copy(version, tmp_path)
    rel = "shards/shard-00000.safetensors"
    with safe_open(str(run / rel), "pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}
        meta = f.metadata()
    mask = tensors[layout.LOSS_MASK]
    first, last = int(mask.nonzero()[0]), int((mask == 0).nonzero()[-1])
    mask[first], mask[last] = 0, 1
    save_file(tensors, str(run / rel), metadata=meta)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["shards"][0]["files"][rel] = {"sha256": sha256_file(run / rel), "bytes": (run / rel).stat().st_size}
    (run / "manifest.json").write_text(json.dumps(manifest))
    assert verify_run(run) == []


@pytest.mark.parametrize("version", STORED)
@pytest.mark.parametrize("fmt, aux", [("speculators", None), ("specforge", ["b0", "b1", "b2"])])
def test_a_stored_run_exports(tmp_path, version, fmt, aux):
    result = export_run(_copy(version, tmp_path), tmp_path / "out", exporter_for(fmt), aux=aux)
    assert result.written == 2 and (tmp_path / "out" / "export.json").is_file()
    assert json.loads((tmp_path / "out" / "export.json").read_text())["run_attestation"] is None


@pytest.mark.parametrize("version", STORED)
def test_a_stored_run_has_no_attestation_a_key_could_prove(tmp_path, version):
    """Sound without a key (its checksums hold), refused with one: nothing in a version-1 or 2 run is signed."""
    key = Ed25519PrivateKey.generate().public_key()
    assert verify_run(_copy(version, tmp_path), key=key) == [
        "run has no attestation.intoto.json: --key can prove nothing about it (runs of format 1 and 2 have none; "
        f"this one says format {version})"]


def test_todays_runs_are_version_3_in_every_file(tmp_path):
    make_run(tmp_path, [[3, 5], [2]])
    assert read_manifest(tmp_path)["format_version"] == layout.FORMAT_VERSION == "3"
    for path in (tmp_path / "shards").glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            assert f.metadata()[layout.META_FORMAT_VERSION] == "3"


def test_an_unknown_version_is_refused_naming_what_this_code_reads(v1_run):
    manifest = json.loads((v1_run / "manifest.json").read_text())
    (v1_run / "manifest.json").write_text(json.dumps({**manifest, "format_version": "9"}))
    with pytest.raises(ManifestError, match=r"format_version='9': this code reads versions 1, 2, 3"):
        read_manifest(v1_run)
    assert "this code reads versions 1, 2, 3" in verify_run(v1_run)[0]
