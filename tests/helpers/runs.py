"""Real `python -m pipeline.extract` processes on the tiny default, for the reliability tests (a fault hook, a lock
holder, a clean reference), and the checks they share."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import REPO

# Two shards of the tiny default, no gate: the fastest run that still has every kind of write step.
SMALL = ("gate.mode=off", "data.limit=6", "runner.max_tokens_per_shard=800")


def extract_cmd(out: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "pipeline.extract", f"out_dir={out}", f"hydra.run.dir={out}.logs", *overrides]


def env_with(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_FAULT")}
    return {**env, **extra}


def extract(out: Path, *overrides: str, fault: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    env = env_with(PIPELINE_FAULT=fault) if fault else env_with()
    return subprocess.run(extract_cmd(out, *overrides), cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def finished_run(factory, name: str, *overrides: str) -> Path:
    """A run of `overrides` extracted to completion in a fresh folder of `factory` (pytest's tmp_path_factory): what a
    test compares other runs of the same command against."""
    out = factory.mktemp(name) / "run"
    done = extract(out, *overrides)
    assert done.returncode == 0, output(done)[-3000:]  # Hydra logs a job's error line to stdout
    return out


def start(out: Path, *overrides: str, fault: str | None = None, trace: Path | None = None,
          log: Path | None = None) -> subprocess.Popen:
    """A run in the background; its output in `log` when given (to watch it while it runs), else in pipes."""
    extra = {"PIPELINE_FAULT": fault} if fault else {}
    if trace is not None:
        extra["PIPELINE_FAULT_TRACE"] = str(trace)
    sink = open(log, "w") if log is not None else subprocess.PIPE
    return subprocess.Popen(extract_cmd(out, *overrides), cwd=REPO, env=env_with(**extra), stdout=sink,
                            stderr=subprocess.STDOUT if log is not None else subprocess.PIPE, text=True)


def wait_for_text(log: Path, text: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in log.read_text():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the run ended (rc {proc.returncode}) before printing {text!r}: "
                                 f"{log.read_text()[-2000:]}")
        time.sleep(0.1)
    raise AssertionError(f"the run did not print {text!r} within {timeout}s")


def wait_for_step(trace: Path, step: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until `proc` has reached `step` (it is paused there by a `pause=` fault)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if trace.is_file() and step in trace.read_text().splitlines():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the run ended (rc {proc.returncode}) before {step}: {proc.stderr.read()[-2000:]}")
        time.sleep(0.1)
    raise AssertionError(f"the run did not reach {step} within {timeout}s")


def verify(run_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline.verify", str(run_dir)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)


def shards_of(run_dir: Path) -> list[dict]:
    """The manifest's shard entries: names, counts and the sha256 of every file."""
    return json.loads((run_dir / "manifest.json").read_text())["shards"]


def snapshot(run_dir: Path) -> dict[str, bytes]:
    """Every file of a run directory, by relative path, with its bytes (the run's output must not change)."""
    return {p.relative_to(run_dir).as_posix(): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def output(done: subprocess.CompletedProcess) -> str:
    """What the run printed (Hydra's log goes to stdout, tracebacks to stderr)."""
    return done.stdout + done.stderr


def error_lines(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in output(done).splitlines() if "[ERROR]" in line]
