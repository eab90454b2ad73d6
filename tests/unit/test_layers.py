"""The layers declared in pyproject.toml ([tool.importlinter]) hold: no upward import, no cycle, engines apart.

The second test proves the check can fail: a copy of the package with one planted upward import is refused.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO

LINT = Path(sys.executable).with_name("lint-imports")


def lint(cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"})


def test_the_import_contracts_hold():
    done = lint(REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "8 kept, 0 broken" in done.stdout


def planted(tmp_path: Path, module: str, line: str) -> subprocess.CompletedProcess:
    """import-linter on a copy of the package with `line` appended to `module` (a path under pipeline/)."""
    shutil.copytree(REPO / "pipeline", tmp_path / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    path = tmp_path / "pipeline" / module
    path.write_text(path.read_text() + line)
    return lint(tmp_path)


def test_an_upward_import_breaks_the_layers(tmp_path):
    done = planted(tmp_path, "points.py", "\n\ndef _upward():\n    from pipeline.run import job  # noqa: F401\n")
    assert done.returncode == 1
    assert "BROKEN" in done.stdout and "pipeline.points -> pipeline.run.job" in done.stdout


def test_an_executor_reading_shards_breaks_its_contract(tmp_path):
    """The executor runs any stage through pipeline.run.contract: a shard import in it is refused."""
    done = planted(tmp_path, "run/executor.py", "\nfrom pipeline.shards import layout  # noqa: E402,F401\n")
    assert done.returncode == 1
    assert "The executors know nothing of shards BROKEN" in done.stdout, done.stdout[-3000:]


def test_reaching_into_the_regeneration_directorys_layout_breaks_its_contract(tmp_path):
    """The regeneration directory's layout is the package's (pipeline.data.regeneration): a module importing it
    directly is refused."""
    done = planted(tmp_path, "regen/stage.py",
                   "\nfrom pipeline.data.regeneration.layout import LAYOUT  # noqa: E402,F401\n")
    assert done.returncode == 1
    assert "The regeneration package owns its directory BROKEN" in done.stdout, done.stdout[-3000:]
