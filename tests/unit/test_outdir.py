"""The output-directory machinery every stage shares (pipeline.core.outdir, pipeline.core.claim), on real files and
real processes: what a layout owns, stale temps, completion markers, and one holder per directory."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.core.claim import DirBusy, DirClaim, read_lease
from pipeline.core.io import atomic_path
from pipeline.core.outdir import Layout, changed, file_records, files_intact, read_marker, write_marker
from pipeline.exports.sidecar import export_layout
from pipeline.exports.specforge import SpecForgeExporter
from pipeline.exports.speculators import SpeculatorsExporter
from pipeline.shards.layout import RUN

DEMO = Layout(kind="demo", files=("done.json", "start.json"), dirs={"parts": (r"part-\d+\.bin",)}, lock=".lock",
              start="start.json", done="done.json")


def test_a_layout_names_what_it_owns_and_nothing_else(tmp_path):
    for name in ("done.json", "start.json", ".lock", ".done.json.a1b2.tmp"):
        (tmp_path / name).touch()
    (tmp_path / "parts").mkdir()
    (tmp_path / "notes.txt").touch()
    (tmp_path / ".other.tmp").touch()  # a temp file, but of no name this layout writes
    assert DEMO.foreign(tmp_path) == [".other.tmp", "notes.txt"]
    assert DEMO.holds("parts", "part-7.bin") and not DEMO.holds("parts", "part-7.bin.bak")
    assert not DEMO.is_done(tmp_path / "missing")
    (tmp_path / "parts").rmdir()
    (tmp_path / "parts").touch()  # a file where the layout keeps a folder is not the layout's
    assert DEMO.foreign(tmp_path) == [".other.tmp", "notes.txt", "parts"]


def test_what_an_owned_folder_holds_is_checked_too(tmp_path):
    """A replacement removes owned folders whole: a user's file or folder inside one is foreign, named with its path;
    a killed writer's temp file there is the layout's own."""
    parts = tmp_path / "parts"
    (parts / "sub").mkdir(parents=True)
    for name in ("part-1.bin", ".part-2.bin.x1.tmp", "notes.txt"):
        (parts / name).touch()
    (parts / "part-3.bin").symlink_to(parts / "part-1.bin")  # a link is not the layout's to remove or vouch for
    (tmp_path / "mine").mkdir()
    assert DEMO.foreign(tmp_path) == ["mine/", "parts/notes.txt", "parts/part-3.bin", "parts/sub/"]


def test_stale_temps_are_those_of_owned_names_at_any_depth_of_owned_folders(tmp_path):
    nested = tmp_path / "parts" / "00"
    nested.mkdir(parents=True)
    stale = [tmp_path / ".start.json.x.tmp", nested / ".part-1.bin.y.tmp"]
    kept = [tmp_path / ".notes.txt.z.tmp", tmp_path / "notes.txt", nested / "part-1.bin"]
    for path in stale + kept:
        path.touch()
    assert sorted(DEMO.stale_temps(tmp_path)) == sorted(stale)
    DEMO.remove_stale_temps(tmp_path)
    assert not any(p.exists() for p in stale) and all(p.exists() for p in kept)


def test_a_marker_means_done_only_while_its_files_keep_their_sizes(tmp_path):
    part = tmp_path / "parts" / "part-0.bin"
    with atomic_path(part) as tmp:
        tmp.write_bytes(b"x" * 10)
    write_marker(tmp_path / "part-0.done.json", {"files": file_records(tmp_path, [part])})
    marker = read_marker(tmp_path / "part-0.done.json")
    assert marker["files"]["parts/part-0.bin"]["bytes"] == 10 and files_intact(tmp_path, marker["files"])
    part.write_bytes(b"x" * 9)  # cut short
    assert not files_intact(tmp_path, marker["files"])
    (tmp_path / "torn.done.json").write_text('{"files": ')
    assert read_marker(tmp_path / "torn.done.json") is None and read_marker(tmp_path / "none.json") is None


def test_changed_names_the_settings_that_differ():
    then = {"config": {"runner": {"storage_dtype": "float8_e4m3fn"}, "seed": 1}, "data": "a"}
    now = {"config": {"runner": {"storage_dtype": None}, "seed": 1}, "data": "a"}
    assert changed(then, now) == ["config (runner.storage_dtype: 'float8_e4m3fn' then, None now)"]


def _holder(root, lock_file):
    code = (f"import sys, time\nfrom pipeline.core.claim import DirClaim\n"
            f"with DirClaim({str(root)!r}, lock_file={lock_file!r}, lease={lock_file is not None}):\n"
            f"    print('held', flush=True)\n    time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.parametrize("lock_file", [None, ".lock"])
def test_one_holder_at_a_time_and_the_claim_dies_with_its_holder(tmp_path, lock_file):
    """With a lock file (and its lease) and on the directory itself (which adds no file): a second claim is refused
    in the caller's words and error class while the holder lives, and granted once it is killed."""
    holder = _holder(tmp_path, lock_file)
    try:
        who = rf"pid {holder.pid} on host"  # a lease names it; a directory locked on itself: the kernel's lock table
        with pytest.raises(KeyError, match=f"busy: {who}"):
            with DirClaim(tmp_path, lock_file=lock_file, lease=lock_file is not None, busy_error=KeyError,
                          refusal=lambda holder: f"busy: {holder}"):
                pass
        with pytest.raises(DirBusy, match=who):
            with DirClaim(tmp_path, lock_file=lock_file):
                pass
        if lock_file is None:
            assert list(tmp_path.iterdir()) == []
    finally:
        holder.kill()
        holder.wait()
    t0 = time.monotonic()
    with DirClaim(tmp_path, lock_file=lock_file, lease=lock_file is not None) as claim:
        assert time.monotonic() - t0 < 5
        if lock_file is not None:
            assert read_lease(tmp_path / lock_file).token == claim.token
    if lock_file is not None:
        assert read_lease(tmp_path / lock_file).released


def test_every_kind_declares_its_files_once():
    assert RUN.lock == ".lock" and RUN.start == "run.json" and RUN.done == "manifest.json"
    assert {"shards", "rejects", "diff"} <= set(RUN.dirs) and RUN.holds("rejects", "shard-00003.parquet")
    assert not RUN.holds("rejects", "shard-3.parquet")
    for exporter in (SpeculatorsExporter(), SpecForgeExporter()):
        export = export_layout(exporter.files)
        assert export.start == ".export-plan.json" and export.done == "export.json"
        folder, *inner = exporter.sample_file(Path("out"), 0).relative_to("out").parts
        assert folder in export.dirs and export.owns(folder) and export.holds(folder, inner[0])
