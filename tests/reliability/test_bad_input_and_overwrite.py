"""Data without one valid record, data that is not what its format says, and overwrite=true beside a user's files:
one clear line each, the right exit status, and nothing finished lost."""
from __future__ import annotations

import json
import shutil

import pytest

from tests.helpers.runs import (
    SMALL,
    error_lines,
    extract,
    output,
    shards_of,
    snapshot,
    verify,
)

pytestmark = pytest.mark.reliability


def _bad_records(path):
    path.write_text("\n".join([json.dumps({"messages": [{"role": "user", "content": "hi"}]}),  # no assistant turn
                               "{not json", json.dumps({"nothing": "usable"})]) + "\n")
    return path


@pytest.mark.parametrize("gate", ["off", "stop"])
@pytest.mark.parametrize("kind", ["empty", "only_bad"])
def test_no_valid_record_is_one_line_with_the_reasons(tmp_path, gate, kind):
    data = tmp_path / "data.jsonl"
    data.write_text("") if kind == "empty" else _bad_records(data)
    out = tmp_path / "run"
    done = extract(out, f"data.path={data}", f"gate.mode={gate}")
    assert done.returncode == 2, output(done)[-3000:]
    (line,) = error_lines(done)
    assert f"no valid records in {data}: " in line
    if kind == "only_bad":
        assert "3 rejected (" in line and "malformed_json: 1" in line and "rejects.parquet" in line
        import pyarrow.parquet as pq

        assert pq.read_table(out / "rejects.parquet").num_rows == 3  # kept for inspection
    else:
        assert "0 rejected (the file holds no record)" in line
    assert not (out / "manifest.json").exists() and not (out / "run.json").exists()
    assert "Traceback" not in output(done)
    fixed = extract(out, *SMALL)  # the same out_dir with usable data: a normal run
    assert fixed.returncode == 0, output(fixed)[-3000:]
    assert verify(out).returncode == 0


def test_a_malformed_json_array_is_one_line(tmp_path):
    data = tmp_path / "data.json"
    data.write_text('[{"messages": [{"role": "user", "content": "hi"}, ')
    done = extract(tmp_path / "run", f"data.path={data}", "gate.mode=off")
    assert done.returncode == 2
    (line,) = error_lines(done)
    assert f"data.path={str(data)!r}" in line and "Traceback" not in output(done)


def test_overwrite_removes_only_what_a_run_writes(finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    (out / "notes.txt").write_text("the user's own file")
    before = snapshot(out)
    refused = extract(out, *SMALL, "overwrite=true", "data.limit=5")
    assert refused.returncode == 2
    (line,) = error_lines(refused)
    assert "files a run does not write (notes.txt)" in line
    assert {k: v for k, v in snapshot(out).items() if k != ".lock"} == {k: v for k, v in before.items() if k != ".lock"}
    (out / "notes.txt").unlink()
    replaced = extract(out, *SMALL, "overwrite=true", "data.limit=5")
    assert replaced.returncode == 0, output(replaced)[-3000:]
    assert verify(out).returncode == 0 and sum(s["num_samples"] for s in shards_of(out)) == 5


@pytest.mark.parametrize("user_entry", ["shards/notes.txt", "rejects/sub/", "diff/notes.txt"])
def test_overwrite_refuses_a_users_entry_inside_a_runs_own_folders(finished, tmp_path, user_entry):
    """A replacement removes a run's folders whole: what they hold must be the run's, at every depth (one check of
    the tree, pipeline.core.outdir.Layout.foreign, which verify's regeneration check uses too)."""
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    target = out / user_entry
    if user_entry.endswith("/"):
        target.mkdir(parents=True)
        (target / "mine.txt").write_text("the user's own file")
    else:
        target.parent.mkdir(exist_ok=True)
        target.write_text("the user's own file")
    before = snapshot(out)
    refused = extract(out, *SMALL, "overwrite=true", "data.limit=5")
    assert refused.returncode == 2, output(refused)[-3000:]
    (line,) = error_lines(refused)
    assert f"files a run does not write ({user_entry})" in line, line
    assert {k: v for k, v in snapshot(out).items() if k != ".lock"} == {k: v for k, v in before.items() if k != ".lock"}


def test_without_overwrite_a_finished_run_is_never_touched(finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    before = snapshot(out)
    for overrides in (SMALL, (*SMALL, "data.limit=5")):
        refused = extract(out, *overrides)
        assert refused.returncode == 2 and "holds a finished run" in error_lines(refused)[0]
    assert snapshot(out) == before
