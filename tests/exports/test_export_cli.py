"""`python -m pipeline.export` as a user runs it: refusals (exit 2, or 3 for a run that does not verify; one line
naming what is wrong), a killed export that a rerun completes without rewriting finished files, a complete export left
alone, an OUT holding another export."""
from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors import safe_open

from pipeline.core.faults import FAULT_ENV
from pipeline.exports.formats import exporter_for
from pipeline.shards.reader import RunReader
from tests.exports.conftest import cli, extract

pytestmark = pytest.mark.integration


def export(run, out, fmt, *args, env=None):
    return cli("pipeline.export", str(run), "--format", fmt, "--out", str(out), *args, env=env)


def killed_at(fmt, index):
    """The environment of an export that kills itself (SIGKILL) once sample `index`'s temp file is complete, before
    its rename: the temp file is left exactly as a crash would leave it."""
    name = exporter_for(fmt).sample_file(Path("out"), index).name
    return {**os.environ, FAULT_ENV: f"kill@write:{name}"}


def _one_line_error(proc, code: int = 2) -> str:
    assert proc.returncode == code, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def run_without_last(tmp_path_factory, models_root):
    """A run that captured final_norm but not bN, as SGLang 0.5.23 would give it."""
    return extract(tmp_path_factory.mktemp("nolast") / "run", "model=tiny_llama", "capture.points=[1,3,5,final_norm]",
                   "data.limit=3")


def test_speculators_refuses_a_run_without_bn_and_says_how_to_capture_it(run_without_last, tmp_path):
    error = _one_line_error(export(run_without_last, tmp_path / "out", "speculators"))
    assert "run has no b6" in error and "final norm" in error
    assert "engine=hf or engine=vllm" in error and "SGLang 0.5.23 cannot capture bN" in error
    assert "capture.points=[" in error and "last" in error
    assert not (tmp_path / "out").exists()  # nothing written


def test_the_last_slot_cannot_be_set_to_another_state(llama_run, tmp_path):
    error = _one_line_error(export(llama_run, tmp_path / "a", "speculators", "--last", "final_norm"))
    assert "--last final_norm" in error and "must be b6" in error
    error = _one_line_error(export(llama_run, tmp_path / "b", "specforge", "--last", "last"))
    assert "--last b6" in error and "must be final_norm" in error


def test_specforge_refuses_other_than_three_aux_states(llama_run, tmp_path):
    error = _one_line_error(export(llama_run, tmp_path / "out", "specforge", "--aux", "b1,b3"))
    assert "exactly 3 aux states, got 2" in error and "[b1, b3]" in error
    error = _one_line_error(export(llama_run, tmp_path / "out", "specforge", "--aux", "b1,b2,b3"))
    assert "b2 not captured" in error


def test_aux_is_written_as_capture_points_is(llama_run, tmp_path):
    """--aux takes capture.points' syntax: canonical boundaries in brackets, or with --convention a framework's native
    ids (SGLang numbers Llama's aux ids k = b(k+1)); both name the same slots, and an id past the model is named."""
    canonical = export(llama_run, tmp_path / "canonical", "specforge", "--aux", "[1,3,5]")
    native = export(llama_run, tmp_path / "native", "specforge", "--aux", "0,2,4", "--convention", "sglang")
    for proc in (canonical, native):
        assert proc.returncode == 0 and "slots b1, b3, b5, final_norm" in proc.stdout, proc.stdout + proc.stderr
    slots = [json.loads((tmp_path / name / "export.json").read_text())["slots"] for name in ("canonical", "native")]
    assert slots[0] == slots[1] and [s["point"] for s in slots[0]] == ["b1", "b3", "b5", "final_norm"]
    error = _one_line_error(export(llama_run, tmp_path / "bad", "specforge", "--aux", "0,2,5", "--convention",
                                   "sglang"))
    assert error.startswith("error: --aux 0,2,5 (--convention sglang): sglang id 5 is out of range"), error
    error = _one_line_error(export(llama_run, tmp_path / "bad", "specforge", "--aux", "b1,b3,x5"))
    assert "capture point 'x5' is not understood" in error
    assert not (tmp_path / "bad").exists()


def test_a_run_that_does_not_verify_is_refused(llama_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(llama_run, run)
    shard = sorted((run / "shards").glob("*.safetensors"))[1]
    data = bytearray(shard.read_bytes())
    data[-100] ^= 0xFF
    shard.write_bytes(bytes(data))
    error = _one_line_error(export(run, tmp_path / "out", "specforge"), code=3)  # refused by a check, as in verify
    assert "does not verify" in error and shard.name in error and "python -m pipeline.verify" in error
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_an_unfinished_run_and_a_usage_error_exit_2(tmp_path):
    error = _one_line_error(export(tmp_path, tmp_path / "out", "specforge"))
    assert "not a finished run" in error
    proc = cli("pipeline.export", str(tmp_path), "--format", "eagle", "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "invalid choice" in proc.stderr


def _finished(out):
    return {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()}


@pytest.mark.parametrize("fmt", ["speculators", "specforge"])
def test_a_killed_export_is_completed_by_a_rerun_without_rewriting_finished_files(fmt, llama_run, tmp_path):
    out = tmp_path / "out"
    killed = export(llama_run, out, fmt, env=killed_at(fmt, 7))
    assert killed.returncode == -9, killed.stderr
    assert not (out / "export.json").exists()  # not finished, and does not look finished
    temps = [p for p in out.rglob("*") if p.name.endswith(".tmp")]
    assert len(temps) == 1 and temps[0].name.startswith(".")  # the half-written file: a name no trainer lists
    before = _finished(out)
    assert len([p for p in before if p.suffix in (".ckpt", ".safetensors")]) == 7  # samples 0..6
    done = export(llama_run, out, fmt)
    assert done.returncode == 0, done.stderr
    assert "5 written, 7 finished earlier" in done.stdout
    after = _finished(out)
    assert all(after[p] == before[p] for p in before if p.exists() and not p.name.startswith("."))
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]
    again = export(llama_run, out, fmt)
    assert again.returncode == 0 and "already complete" in again.stdout and _finished(out) == after


def test_resumed_speculators_files_hold_the_runs_slots(llama_run, tmp_path):
    """The files written before and after the kill are the same as a one-go export's (safetensors: read here)."""
    out = tmp_path / "out"
    export(llama_run, out, "speculators", env=killed_at("speculators", 3))
    assert export(llama_run, out, "speculators").returncode == 0
    with RunReader(llama_run) as reader:
        for i, sample in enumerate(reader.iter_samples()):
            with safe_open(str(out / "hidden_states" / f"hs_{i}.safetensors"), "pt") as f:
                assert f.get_tensor("hidden_states").equal(sample["hidden_states"][:, [0, 1, 2, 3]])
                assert f.metadata()["sample_id"] == sample["sample_id"]


def test_the_export_carries_the_runs_attestation_digest(llama_run, tmp_path):
    """export.json names the exact run it came from by its attestation (the file's sha256, the statement's, who signed
    it: this run is unsigned), so `pipeline.verify RUN --key PUB` can prove the run behind a trained draft."""
    out = tmp_path / "out"
    assert export(llama_run, out, "specforge").returncode == 0
    envelope = (llama_run / "attestation.intoto.json").read_bytes()
    statement = base64.b64decode(json.loads(envelope)["payload"])
    assert json.loads((out / "export.json").read_text())["run_attestation"] == {
        "sha256": hashlib.sha256(envelope).hexdigest(), "statement_sha256": hashlib.sha256(statement).hexdigest(),
        "claimed_keyids": []}


def test_out_holding_another_export_or_other_files_is_refused(llama_run, tmp_path):
    out = tmp_path / "out"
    assert export(llama_run, out, "speculators").returncode == 0
    error = _one_line_error(export(llama_run, out, "specforge"))
    assert "holds a finished export" in error and "'speculators' then" in error
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("x")
    assert "not empty" in _one_line_error(export(llama_run, other, "speculators"))
    sidecar = json.loads((out / "export.json").read_text())
    (out / "export.json").write_text(json.dumps({**sidecar, "sidecar_version": "9"}))
    error = _one_line_error(export(llama_run, out, "speculators"))
    assert "sidecar_version '9', which this code does not read (it reads 1, 2)" in error, error
    # a version 1 export (run_attestation.signed_by) is still found complete
    v1 = {**sidecar, "sidecar_version": "1", "run_attestation": {
        **{k: v for k, v in sidecar["run_attestation"].items() if k != "claimed_keyids"}, "signed_by": []}}
    (out / "export.json").write_text(json.dumps(v1))
    again = export(llama_run, out, "speculators")
    assert again.returncode == 0 and "already complete" in again.stdout, again.stderr


def test_a_second_export_into_an_out_being_written_is_refused_and_the_first_is_untouched(llama_run, tmp_path):
    """While one export holds OUT (here a process that took it through the exports' own lock, as an export does for
    its whole run), another is refused before touching anything; once the holder is gone (killed: the kernel drops
    the lock) the same command completes the export."""
    out = tmp_path / "out"
    killed = export(llama_run, out, "speculators", env=killed_at("speculators", 4))
    assert killed.returncode == -9
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    holder = subprocess.Popen(
        [sys.executable, "-c", "import time\nfrom pathlib import Path\nfrom pipeline.core.lifecycle import claim\n"
         "from pipeline.exports.sidecar import export_dir\nfrom pipeline.exports.speculators import FILES\n"
         f"with claim(Path({str(out)!r}), kind=export_dir(FILES)):\n    print('held', flush=True)\n"
         "    time.sleep(120)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        error = _one_line_error(export(llama_run, out, "speculators"))
        assert "another export is writing it" in error and str(out) in error
        assert f"in use by pid {holder.pid} on host" in error  # named from the kernel's lock table: no lock file
        assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before  # its temp file included
    finally:
        holder.kill()
        holder.wait()
    done = export(llama_run, out, "speculators")
    assert done.returncode == 0 and "8 written, 4 finished earlier" in done.stdout, done.stdout + done.stderr
