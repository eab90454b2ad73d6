"""Every format version still reads: a run written by the version-1 code (tests/data/run-format-1, made by commit
b7498a0 with `model=tiny_llama data.limit=2 data.max_length=48 gate.mode=off runner.max_samples_per_shard=1`)
verifies, reads and exports with today's code, and a run written today says version 2."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors import safe_open

from pipeline.exports.driver import export_run
from pipeline.exports.formats import exporter_for
from pipeline.shards import layout
from pipeline.shards.manifest import ManifestError, read_manifest
from pipeline.shards.reader import RunReader
from pipeline.shards.verify import verify_run
from tests.helpers.shards import make_run

FORMAT_1 = Path(__file__).resolve().parents[1] / "data" / "run-format-1"


@pytest.fixture
def v1_run(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(FORMAT_1, run)
    return run


def test_a_version_1_run_verifies_and_reads(v1_run):
    assert json.loads((v1_run / "manifest.json").read_text())["format_version"] == "1"
    assert verify_run(v1_run) == []
    with RunReader(v1_run) as reader:
        samples = list(reader.iter_samples())
    assert [s["hidden_states"].shape[1:] for s in samples] == [(5, 256)] * 2
    assert sum(s["input_ids"].numel() for s in samples) == 96
    assert read_manifest(v1_run)["storage"]["scaling"] == "none"


@pytest.mark.parametrize("fmt, aux", [("speculators", None), ("specforge", ["b0", "b1", "b2"])])
def test_a_version_1_run_exports(v1_run, tmp_path, fmt, aux):
    result = export_run(v1_run, tmp_path / "out", exporter_for(fmt), aux=aux)
    assert result.written == 2 and (tmp_path / "out" / "export.json").is_file()


def test_todays_runs_are_version_2_in_every_file(tmp_path):
    make_run(tmp_path, [[3, 5], [2]])
    assert read_manifest(tmp_path)["format_version"] == layout.FORMAT_VERSION == "2"
    for path in (tmp_path / "shards").glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            assert f.metadata()[layout.META_FORMAT_VERSION] == "2"


def test_an_unknown_version_is_refused_naming_what_this_code_reads(v1_run):
    manifest = json.loads((v1_run / "manifest.json").read_text())
    (v1_run / "manifest.json").write_text(json.dumps({**manifest, "format_version": "9"}))
    with pytest.raises(ManifestError, match=r"format_version='9': this code reads versions 1, 2"):
        read_manifest(v1_run)
    assert "this code reads versions 1, 2" in verify_run(v1_run)[0]
