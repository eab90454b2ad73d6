"""`python -m pipeline.verify` on a real finished run, tampered with in every way issue #16 found unchecked: each kind
is exit status 3 and one stderr line naming the file and what is wrong; the untampered run verifies sound.

One real run per module (the HF engine on the tiny Kimi target, gate off, a zstd-compressed data file with two bad
records, truncation to 96 tokens), copied for each case. It also shows truncation counted in the manifest and in
extract's summary, and a compressed input read end to end.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import zstandard

from pipeline.core.io import sha256_file
from pipeline.factory.tokenizer import bundled_conversations_path
from pipeline.provenance import digest
from pipeline.verify import main as verify_main

pytestmark = pytest.mark.reliability
REPO = Path(__file__).resolve().parents[2]
BAD_RECORDS = ["{not json", json.dumps({"messages": [{"role": "user", "content": "hi"}]})]  # 2 rejects, 2 reasons
RUN = ("gate.mode=off", "data.limit=8", "runner.max_samples_per_shard=4", "data.max_length=96")
ST0, ST1 = "shards/shard-00000.safetensors", "shards/shard-00001.safetensors"


def cli(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def finished(tmp_path_factory, models_root):
    root = tmp_path_factory.mktemp("tamper")
    lines = BAD_RECORDS + bundled_conversations_path().read_text().splitlines()[:12]
    data = root / "conversations.jsonl.zst"
    data.write_bytes(zstandard.ZstdCompressor().compress(("\n".join(lines) + "\n").encode()))
    proc = cli("pipeline.extract", f"out_dir={root / 'run'}", f"data.path={data}", *RUN,
               f"hydra.run.dir={root / 'logs'}")
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    return root / "run", proc


@pytest.fixture
def run(finished, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(finished[0], copy, symlinks=True)
    return copy


def verify(run_dir: Path, capsys) -> tuple[int, list[str]]:
    """verify's exit status and its stderr lines (the entry point itself, in this process)."""
    capsys.readouterr()
    status = verify_main([str(run_dir)])
    return status, capsys.readouterr().err.splitlines()


def edit_manifest(run_dir: Path, edit) -> dict:
    manifest = json.loads((run_dir / "manifest.json").read_text())
    edit(manifest)
    (run_dir / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return manifest


def relist(run_dir: Path, index: int, old: str, new: str) -> None:
    """List shard `index`'s file `old` under the path `new` (size and sha256 kept: only the path is wrong)."""
    def edit(manifest):
        files = manifest["shards"][index]["files"]
        files[new] = files.pop(old)
    edit_manifest(run_dir, edit)


def test_the_untampered_run_is_sound_and_counts_what_it_read(finished, capsys):
    out, proc = finished
    status, errors = verify(out, capsys)
    assert status == 0 and errors == []
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["num_samples"] == 8 and len(manifest["shards"]) == 2
    assert manifest["rejects"]["total"] == 2  # read through zstd: the two bad records are rejects with reasons
    assert manifest["rejects"]["by_reason"] == {"malformed_json": 1, "no_assistant_turn": 1}
    assert cli("pipeline.verify", str(out)).returncode == 0


def test_truncation_is_counted_in_the_manifest_and_the_summary(finished):
    out, proc = finished
    manifest = json.loads((out / "manifest.json").read_text())
    flags = [flag for p in sorted((out / "shards").glob("*.parquet")) for flag in pq.read_table(p)["truncated"]]
    truncated = sum(flag.as_py() for flag in flags)
    assert 0 < truncated < len(flags) == manifest["num_samples"]
    assert manifest["num_truncated"] == truncated
    assert f"{truncated} truncated to data.max_length" in proc.stdout


def _recompute_digest(manifest):
    manifest["provenance_digest"] = digest(manifest["provenance"])


PROVENANCE_EDITS = {
    "data_path": lambda m: m["provenance"]["config"]["data"].update(path="/data/another.jsonl"),
    "max_length": lambda m: m["provenance"]["config"]["data"].update(max_length=4096),
    "stored_digest": lambda m: m.update(provenance_digest="0" * 64),
}


@pytest.mark.parametrize("kind", sorted(PROVENANCE_EDITS))
def test_an_edited_provenance_or_digest_is_named(run, capsys, kind):
    manifest = edit_manifest(run, PROVENANCE_EDITS[kind])
    status, errors = verify(run, capsys)
    assert status == 3
    assert any(line.startswith("manifest provenance_digest ") and f"!= {digest(manifest['provenance'])!r}, the "
               "digest of its provenance" in line for line in errors), errors


@pytest.mark.parametrize("field, value", [("path", "/data/another.jsonl"), ("max_length", 4096)])
def test_an_edit_with_its_digest_recomputed_is_named_against_the_start_record(run, capsys, field, value):
    before = json.loads((run / "run.json").read_text())["config"]["data"][field]
    edit_manifest(run, lambda m: (m["provenance"]["config"]["data"].update({field: value}), _recompute_digest(m)))
    status, errors = verify(run, capsys)
    assert status == 3
    assert f"manifest provenance data.{field} {value!r} != {before!r} in run.json, the record the run started " \
           "from" in errors


REJECT_EDITS = {
    "total": (lambda m: m["rejects"].update(total=3), "manifest rejects total=3 but rejects.parquet and rejects/ "
              "hold 2 rejects"),
    "by_reason": (lambda m: m["rejects"].update(by_reason={"malformed_json": 2}), "manifest rejects "
                  "by_reason={'malformed_json': 2} but rejects.parquet and rejects/ hold {'malformed_json': 1, "
                  "'no_assistant_turn': 1}"),
}


@pytest.mark.parametrize("kind", sorted(REJECT_EDITS))
def test_edited_reject_counts_are_named(run, capsys, kind):
    edit, line = REJECT_EDITS[kind]
    edit_manifest(run, edit)
    status, errors = verify(run, capsys)
    assert status == 3 and line in errors, errors


def test_capture_rejects_under_rejects_are_counted(run, capsys):
    (run / "rejects").mkdir()
    shutil.copy(run / "rejects.parquet", run / "rejects" / "shard-00001.parquet")  # as if unit 1 had rejected two
    status, errors = verify(run, capsys)
    assert status == 3
    assert "manifest rejects total=2 but rejects.parquet and rejects/ hold 4 rejects" in errors


def test_an_edited_truncation_count_is_named(run, capsys):
    manifest = edit_manifest(run, lambda m: m.update(num_truncated=m["num_truncated"] + 1))
    status, errors = verify(run, capsys)
    assert status == 3
    assert errors[0] == (f"manifest num_truncated={manifest['num_truncated']} but its shards hold "
                         f"{manifest['num_truncated'] - 1} truncated samples")


def _move_to_other_run(run: Path) -> Path:
    """Shard 0's safetensors moved into a sibling run: the path listed next exists and has the recorded bytes (before
    #16 the run verified "sound")."""
    other = run.parent / "other-run"
    (other / "shards").mkdir(parents=True)
    shutil.move(run / ST0, other / ST0)
    return other


def test_a_listed_path_into_another_run_is_named(run, capsys):
    _move_to_other_run(run)
    relist(run, 0, ST0, f"../other-run/{ST0}")
    status, errors = verify(run, capsys)
    assert (status, errors[:-1]) == (3, [f"shard-00000: listed file ../other-run/{ST0} leaves the run directory (a "
                                         "'..' component)"])


def test_an_absolute_listed_path_is_named(run, capsys):
    other = _move_to_other_run(run)
    relist(run, 0, ST0, str(other / ST0))
    status, errors = verify(run, capsys)
    assert (status, errors[:-1]) == (3, [f"shard-00000: listed file {other / ST0} is an absolute path: files are "
                                         "listed relative to the run directory"])


def test_a_symlinked_shard_is_named(run, capsys):
    elsewhere = run.parent / "elsewhere.safetensors"
    shutil.move(run / ST1, elsewhere)
    os.symlink(elsewhere, run / ST1)  # the same bytes, but not the run's to vouch for
    status, errors = verify(run, capsys)
    assert status == 3
    assert errors[0] == (f"symlink {ST1} -> {elsewhere} in the run directory: a run's files are regular files in "
                         "it"), errors


def test_a_shard_only_the_pipelines_own_parser_reads_is_named(run, capsys):
    """Bytes after the last tensor of a real shard, its size and sha256 relisted: the writer's own parser reads it, the
    safetensors library (the reader of every trainer) refuses it."""
    with open(run / ST1, "ab") as f:
        f.write(bytes(8))
    record = {"sha256": sha256_file(run / ST1), "bytes": (run / ST1).stat().st_size}
    edit_manifest(run, lambda m: m["shards"][1]["files"][ST1].update(record))
    status, errors = verify(run, capsys)
    assert status == 3 and len(errors) == 2, errors
    assert errors[0].startswith("shard-00001: the safetensors library rejects shard-00001.safetensors (") \
        and "file not fully covered" in errors[0] and errors[0].endswith(", though the pipeline's own parser reads it")


def test_a_stray_user_file_in_the_run_root_is_named(run, capsys):
    (run / "notes.txt").write_text("my notes\n")
    status, errors = verify(run, capsys)
    assert status == 3
    assert errors[0] == "unknown file notes.txt in the run directory: not a file a run writes", errors


@pytest.mark.parametrize("name", [".manifest.json.k3j2h1x0.tmp", "shards/.shard-00001.safetensors.a8f2k1.tmp"])
def test_a_stale_temp_file_is_named(run, capsys, name):
    (run / name).write_bytes((run / "manifest.json").read_bytes()[:100])  # as a kill during the write leaves it
    status, errors = verify(run, capsys)
    assert status == 3
    assert errors[0] == f"stale temp file {name}: left by an interrupted write (a finished run has none); remove it"


def test_the_files_a_run_writes_are_known(run, capsys):
    """The out_dir lock, the gate's report and a unit's capture rejects are the run's own; a tamper-free copy stays
    sound with them present (the capture rejects are listed in the counts here, as a run that had them would)."""
    (run / ".lock").write_text("pid 1 host x\n")
    (run / "diff").mkdir()
    for name in ("report.json", "report.md", "report.html"):
        (run / "diff" / name).write_text("{}")
    (run / "rejects").mkdir()
    shutil.copy(run / "rejects.parquet", run / "rejects" / "shard-00000.parquet")
    edit_manifest(run, lambda m: m["rejects"].update(total=4, by_reason={"malformed_json": 2,
                                                                          "no_assistant_turn": 2}))
    status, errors = verify(run, capsys)
    assert (status, errors) == (0, [])


def test_the_cli_names_a_tampered_run_on_stderr(run):
    (run / "notes.txt").write_text("x")
    bad_sha = sha256_file(run / "manifest.json")
    proc = cli("pipeline.verify", str(run))
    assert proc.returncode == 3
    assert proc.stderr.splitlines() == ["unknown file notes.txt in the run directory: not a file a run writes",
                                        f"1 problem(s) in {run}"]
    assert sha256_file(run / "manifest.json") == bad_sha  # verify reads, never writes
