"""Nothing the pipeline writes may land inside a run directory that is not that run's own: an export, a diff report or
another run there would be files the run's verification names as not its own, so the finished run would no longer
verify and exports would refuse it. Each is refused before it writes anything, and the run stays sound, byte for byte."""
from __future__ import annotations

import pytest

from tests.helpers.cli import cli
from tests.helpers.runs import SMALL, extract, output, snapshot, verify

pytestmark = pytest.mark.reliability


def test_exports_reports_and_runs_inside_a_finished_run_are_refused(finished, tmp_path):
    before = snapshot(finished)
    logs = f"hydra.run.dir={tmp_path / 'logs'}"  # Hydra's own log directory, outside the run
    refused = {
        "export into the run": cli("pipeline.export", str(finished), "--format", "speculators", "--out",
                                   str(finished)),
        "export below the run": cli("pipeline.export", str(finished), "--format", "specforge", "--out",
                                    str(finished / "exports" / "specforge")),
        "diff into the run": cli("pipeline.diff", f"out_dir={finished}", logs),
        "diff below the run": cli("pipeline.diff", f"out_dir={finished / 'shards' / 'check'}", logs),
        "run below the run": cli("pipeline.extract", f"out_dir={finished / 'again'}", logs, *SMALL),
    }
    for what, done in refused.items():
        assert done.returncode == 2, (what, output(done)[-2000:])
        lines = [line for line in output(done).splitlines() if "error" in line.lower()]
        assert len(lines) == 1 and str(finished) in lines[0] and "fail verification" in lines[0], (what, lines)
    assert snapshot(finished) == before
    assert not (finished / "exports").exists() and not (finished / "again").exists()
    assert not (finished / "shards" / "check").exists() and not list(finished.glob("report.*"))
    assert verify(finished).returncode == 0


def test_a_run_beside_the_run_is_written(finished):
    """The check is about the run's own directory, not its parent."""
    sibling = finished.parent / "sibling"
    done = extract(sibling, *SMALL)
    assert done.returncode == 0, output(done)[-2000:]
    assert verify(sibling).returncode == 0 and verify(finished).returncode == 0
