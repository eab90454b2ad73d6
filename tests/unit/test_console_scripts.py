"""The console scripts of pyproject.toml's [project.scripts], run as a user runs them: from another directory, by the
file scripts/setup.sh installs beside this Python; the same main() and exit codes as `python -m pipeline.<name>`."""
from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.helpers.shards import make_run

ENTRY_POINTS = ("extract", "diff", "verify", "export", "doctor", "regenerate", "accept")
SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
BIN = Path(sys.executable).parent


def script(name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    path = BIN / name
    assert path.is_file(), (f"{path} is missing: scripts/setup.sh installs pyproject.toml's [project.scripts] "
                            f"(it reinstalls the package when pyproject.toml changes: rerun it)")
    # This checkout's code, also where the environment's editable install is another checkout's (a shared .venv).
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([str(path), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_every_entry_point_is_a_console_script():
    assert SCRIPTS == {f"pipeline-{name}": f"pipeline.{name}:main" for name in ENTRY_POINTS}


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_each_console_script_answers_help(name, tmp_path):
    done = script(f"pipeline-{name}", "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert name in done.stdout.splitlines()[0], done.stdout  # "usage: python -m pipeline.verify" / "diff is powered"


def test_pipeline_verify_checks_a_run_with_verifys_exit_codes(tmp_path):
    run = tmp_path / "run"
    make_run(run, [[3, 5]])
    sound = script("pipeline-verify", str(run), cwd=tmp_path)
    assert sound.returncode == 0 and sound.stdout.startswith(f"sound: {run}: 1 shard(s), 2 samples"), sound.stderr
    missing = script("pipeline-verify", str(tmp_path / "nowhere"), cwd=tmp_path)
    assert (missing.returncode, missing.stderr.splitlines()) == (
        2, [f"error: run directory {tmp_path / 'nowhere'} does not exist"])
    (run / "notes.txt").write_text("x")
    tampered = script("pipeline-verify", str(run), cwd=tmp_path)
    assert tampered.returncode == 3 and "unknown file notes.txt" in tampered.stderr


def test_pipeline_diff_refuses_an_unknown_key_from_any_directory(tmp_path):
    done = script("pipeline-diff", "daat.x=1", f"out_dir={tmp_path / 'out'}", cwd=tmp_path)
    assert (done.returncode, done.stderr.splitlines()) == (
        2, ["configuration error: unknown config key daat (did you mean data?)"]), done.stdout + done.stderr
    assert not (tmp_path / "out").exists()
