"""A kill -9 or a failing disk at any write step of a run leaves a state that rerunning the same command resumes,
and the resumed run's shards are byte for byte those of an uninterrupted run."""
from __future__ import annotations

import shutil

import pytest

from tests.helpers.runs import SMALL, error_lines, extract, finished_run, output, shards_of, verify
from tests.helpers.sweep import sampled

pytestmark = pytest.mark.reliability

# Every write step of SMALL, in the order a run takes them (the first test checks the list is complete). Shard 1
# repeats shard 0's code: its first and last steps stand for the rest.
STEPS = ["write:run.json", "rename:run.json", "write:rejects.parquet", "rename:rejects.parquet",
         "unlink:shard-00000.done.json", "write:shard-00000.safetensors", "rename:shard-00000.safetensors",
         "write:shard-00000.parquet", "rename:shard-00000.parquet", "write:shard-00000.done.json",
         "rename:shard-00000.done.json", "unlink:shard-00001.done.json", "rename:shard-00001.done.json",
         "write:attestation.intoto.json", "rename:attestation.intoto.json", "write:manifest.json",
         "rename:manifest.json"]
# What each default run kills at: one step of each kind (write, rename, unlink) in the run record, a shard, its done
# marker and the manifest, and the last step (the run already finished). --every-case kills at every step.
KILLS = ["write:run.json", "unlink:shard-00000.done.json", "write:shard-00000.safetensors",
         "rename:shard-00000.parquet", "rename:shard-00001.done.json", "write:manifest.json", "rename:manifest.json"]
FULL_DISKS = ["write:rejects.parquet", "write:shard-00000.safetensors", "write:manifest.json"]


@pytest.fixture(scope="module")
def clean(tmp_path_factory, models_root):
    return finished_run(tmp_path_factory, "clean", *SMALL)


def test_the_step_list_covers_every_write_of_a_run(clean, tmp_path):
    import os
    import subprocess
    import sys

    from tests.helpers.runs import REPO, env_with, extract_cmd

    trace = tmp_path / "steps.txt"
    done = subprocess.run(extract_cmd(tmp_path / "run", *SMALL), cwd=REPO, capture_output=True, text=True,
                          env=env_with(PIPELINE_FAULT_TRACE=str(trace)), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [s for s in trace.read_text().split() if not s.startswith("start:")]  # the command's start writes nothing
    assert set(STEPS) <= set(steps)
    assert {s.replace("00001", "00000") for s in steps} == {s.replace("00001", "00000") for s in STEPS}
    assert os.path.exists(sys.executable)


@pytest.mark.parametrize("step", sampled(STEPS, KILLS))
def test_a_kill_at_any_step_is_resumed_by_the_same_command(clean, tmp_path, step):
    out = tmp_path / "run"
    killed = extract(out, *SMALL, fault=f"kill@{step}")
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not (out / "manifest.json").exists() or step == "rename:manifest.json"
    resumed = extract(out, *SMALL)
    if step == "rename:manifest.json":  # the run was finished when it died: the same command refuses to redo it
        assert resumed.returncode == 2 and "holds a finished run" in output(resumed)
    else:
        assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert verify(out).returncode == 0, verify(out).stderr
    assert shards_of(out) == shards_of(clean)
    assert not [p for p in out.rglob(".*.tmp")], "a resumed run leaves no temp file behind"


@pytest.mark.parametrize("step", sampled([s for s in STEPS if s.startswith("write:")], FULL_DISKS))
def test_a_full_disk_is_one_line_and_a_rerun_resumes(clean, tmp_path, step):
    out = tmp_path / "run"
    failed = extract(out, *SMALL, fault=f"enospc@{step}")
    assert failed.returncode == 1
    name = step.split(":", 1)[1]
    (line,) = error_lines(failed)
    assert name in line and "No space left on device (ENOSPC)" in line
    assert f"{out}/" in line and "rerun the same command to resume" in line
    assert "Traceback" not in output(failed)
    assert not (out / "manifest.json").exists()
    resumed = extract(out, *SMALL)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert verify(out).returncode == 0 and shards_of(out) == shards_of(clean)


@pytest.mark.parametrize("step", ["remove:manifest.json", "remove:shards"])
def test_a_replacement_cut_short_is_finished_by_the_same_command(clean, tmp_path, step):
    out = tmp_path / "run"
    shutil.copytree(clean, out)
    replace = (*SMALL, "overwrite=true", "data.limit=5")
    killed = extract(out, *replace, fault=f"kill@{step}")
    assert killed.returncode == -9
    assert not (out / "manifest.json").exists(), "a replacement cut short never looks finished"
    done = extract(out, *replace)
    assert done.returncode == 0, done.stderr[-3000:]
    assert verify(out).returncode == 0
    assert sum(s["num_samples"] for s in shards_of(out)) == 5
