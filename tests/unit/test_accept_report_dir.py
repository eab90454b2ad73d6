"""The acceptance report's directory (pipeline.acceptance.report_dir) on real files: what it refuses before anything is
measured, the directory it gives back when a measurement fails, and a replacement that writes report.json last."""
from __future__ import annotations

import json
import re
import socket
import subprocess
import sys

import pytest

from pipeline.acceptance import report_dir
from pipeline.core.cli import UsageError
from pipeline.core.faults import FAULT_ENV


def _finished(path):
    path.mkdir()
    report_dir.write(path, report_json=json.dumps({"old": True}), report_md="old md", report_html="<p>old</p>")
    return path


def test_a_finished_report_is_replaced_only_with_overwrite(tmp_path):
    out = _finished(tmp_path / "out")
    with pytest.raises(UsageError, match=r"holds a finished acceptance report \(report.json\); choose another --out, or pass --overwrite"):
        report_dir.check(out, overwrite=False)
    report_dir.check(out, overwrite=True)
    assert json.loads((out / "report.json").read_text()) == {"old": True}  # checking changes nothing


def test_files_the_report_does_not_write_are_refused_by_name(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match=r"is not empty and holds no acceptance report \(notes.txt\)"):
        report_dir.check(out, overwrite=True)
    assert (out / "notes.txt").read_text() == "mine"
    finished = _finished(tmp_path / "finished")
    (finished / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match=r"files an acceptance report does not write \(notes.txt\); --overwrite "
                                         r"removes only an acceptance report's own files"):
        report_dir.check(finished, overwrite=True)


def test_a_failed_measurement_removes_only_the_directory_it_created(tmp_path):
    new = tmp_path / "new"
    with pytest.raises(RuntimeError):
        with report_dir.taken(new, overwrite=False):
            assert new.is_dir()
            raise RuntimeError("vLLM failed")
    assert not new.exists()
    old = _finished(tmp_path / "old")
    before = {p.name: p.read_bytes() for p in old.iterdir()}
    with pytest.raises(RuntimeError):
        with report_dir.taken(old, overwrite=True):
            raise RuntimeError("vLLM failed")
    assert {p.name: p.read_bytes() for p in old.iterdir()} == before  # the old report as it was


def test_a_directory_another_process_measures_into_is_refused(tmp_path):
    out = tmp_path / "busy"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY); "
        "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)"), str(out)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        # the holder named from the kernel's lock table: no lease file is kept in a report directory
        busy = f"in use by pid {holder.pid} on host {socket.gethostname()}: another accept is writing it"
        with pytest.raises(UsageError, match=re.escape(busy)):
            with report_dir.taken(out, overwrite=False):
                pytest.fail("taken while another process holds it")
    finally:
        holder.kill()
        holder.wait()
    assert out.is_dir() and not any(out.iterdir())


def test_a_replacement_cut_short_never_looks_finished(tmp_path, monkeypatch):
    out = _finished(tmp_path / "out")
    monkeypatch.setenv(FAULT_ENV, "enospc@write:report.html")
    with pytest.raises(OSError):
        report_dir.write(out, report_json=json.dumps({"new": True}), report_md="new md", report_html="<p>new</p>")
    assert not (out / "report.json").exists() and (out / "report.md").read_text() == "new md"
    report_dir.check(out, overwrite=False)  # an unfinished report: the next measurement may write there
    monkeypatch.delenv(FAULT_ENV)
    report_dir.write(out, report_json=json.dumps({"new": True}), report_md="new md", report_html="<p>new</p>")
    assert json.loads((out / "report.json").read_text()) == {"new": True}
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "report.json", "report.md"]
