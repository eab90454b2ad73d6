"""What issue 24 found still owing one line (pipeline/core/cli.py; docs/reference/exit-codes.md), each on the real commands:
Ctrl-C and SIGTERM while a command is still importing (a traceback through importlib, or silence), an export on a
full disk (a real file-size limit, not a fault hook: torch.save's own writer failed with a RuntimeError), an export's
`--out` that is a regular file (exit 1, so a scheduler retried it), Hydra's type-conversion and interpolation errors
in a sweep (`-m`) and in `${...}` (exit 1); and SpecForge exports byte-identical across runs and resumes (each
`.ckpt` used to carry its random temp-file name).
"""
from __future__ import annotations

import hashlib
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.cli import INTERRUPTED_LINE, ExitCode
from tests.helpers import REPO
from tests.helpers.cli import cli
from tests.helpers.runs import env_with, output, wait_for_step

pytestmark = pytest.mark.reliability
COMMANDS = ("extract", "diff", "verify", "export", "doctor")


def one_line(done: subprocess.CompletedProcess, text: str) -> str:
    lines = [line for line in output(done).splitlines() if text in line]
    assert len(lines) == 1 and "Traceback" not in output(done), output(done)[-3000:]
    return lines[0]


def digests(root: Path) -> dict[str, str]:
    """sha256 of every file under `root` (hidden ones included), by relative path."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def export(run: Path, out: Path, *, fault: str | None = None, fsize: int | None = None
           ) -> subprocess.CompletedProcess:
    """`python -m pipeline.export RUN --format specforge --out OUT`; with `fsize`, under a file-size limit of that
    many bytes (RLIMIT_FSIZE, SIGXFSZ ignored: a write past it fails with EFBIG, as a full disk's with ENOSPC)."""
    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    env = env_with(PIPELINE_FAULT=fault) if fault else env_with()
    return subprocess.run([sys.executable, "-m", "pipeline.export", str(run), "--format", "specforge", "--out",
                           str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
                          preexec_fn=limit if fsize else None)


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("signum, code", [(signal.SIGINT, ExitCode.INTERRUPTED), (signal.SIGTERM, ExitCode.TERMINATED)],
                         ids=["ctrl-c", "sigterm"])
def test_a_signal_while_the_command_imports_is_one_line(tmp_path, command, signum, code):
    """Held at its first step (`start:<command>`, before torch, transformers or Hydra are imported): before the fix
    Ctrl-C there printed importlib's traceback and SIGTERM killed it without a word (exit -15)."""
    trace = tmp_path / "steps.txt"
    env = env_with(PIPELINE_FAULT=f"pause={tmp_path / 'never'}@start:{command}", PIPELINE_FAULT_TRACE=str(trace))
    proc = subprocess.Popen([sys.executable, "-m", f"pipeline.{command}", "--help"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    wait_for_step(trace, f"start:{command}", proc)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, err.splitlines(), out) == (code, [INTERRUPTED_LINE], ""), err[-3000:]


def test_an_export_on_a_full_disk_is_one_line_and_resumes_to_the_same_files(finished, tmp_path):
    clean = tmp_path / "clean"
    assert export(finished, clean).returncode == ExitCode.OK
    sample = max(p.stat().st_size for p in clean.rglob("*.ckpt"))
    full = export(finished, tmp_path / "full", fsize=sample // 2)  # the plan fits, no sample file does
    assert full.returncode == ExitCode.FAILED, output(full)[-3000:]
    assert one_line(full, "File too large") == \
        f"error: {tmp_path / 'full' / 'data' / '000000' / 'data_0000000000.ckpt'}: File too large (EFBIG)"
    assert not list((tmp_path / "full").rglob("*.ckpt")) and not list((tmp_path / "full").rglob(".*.tmp"))
    resumed = export(finished, tmp_path / "full")
    assert resumed.returncode == ExitCode.OK, output(resumed)[-3000:]
    assert digests(tmp_path / "full") == digests(clean)


@pytest.mark.parametrize("where, line", [
    ("file", "error: --out {file} exists and is not a directory"),
    ("file/sub", "error: --out {file}/sub cannot be created: {file} is a file"),
], ids=["a-file", "through-a-file"])
def test_an_export_out_that_is_a_regular_file_is_a_usage_error(finished, tmp_path, where, line):
    (tmp_path / "file").write_text("a user's file")
    done = export(finished, tmp_path / where)
    assert done.returncode == ExitCode.USAGE, output(done)[-3000:]
    assert one_line(done, "--out") == line.format(file=tmp_path / "file")
    assert (tmp_path / "file").read_text() == "a user's file"


@pytest.mark.parametrize("module, args, line", [
    ("pipeline.extract", ("-m", "runner.max_tokens_per_shard=100,abc"),
     "configuration error: Error merging override runner.max_tokens_per_shard=abc: Value 'abc' of type 'str' could "
     "not be converted to Integer"),
    ("pipeline.extract", ("--multirun", "overwrite=maybe"),
     "configuration error: Error merging override overwrite=maybe: Value 'maybe' is not a valid bool (type str)"),
    ("pipeline.extract", ("overwrite=maybe",),
     "configuration error: Error merging override overwrite=maybe: Value 'maybe' is not a valid bool (type str)"),
    ("pipeline.extract", ("runner.max_tokens_per_shard=${oops}",),
     "configuration error: runner.max_tokens_per_shard: Interpolation key 'oops' not found"),
    ("pipeline.diff", ("out_dir=${nowhere.x}",), "configuration error: out_dir: Interpolation key 'nowhere.x' not found"),
], ids=["sweep-wrong-type", "multirun-wrong-bool", "wrong-bool", "extract-interpolation", "diff-interpolation"])
def test_hydra_type_and_interpolation_errors_are_configuration_errors(tmp_path, module, args, line):
    done = cli(module, *args, f"hydra.run.dir={tmp_path / 'logs'}", f"hydra.sweep.dir={tmp_path / 'sweep'}",
               timeout=300)
    assert done.returncode == ExitCode.USAGE, output(done)[-3000:]
    assert one_line(done, "configuration error") == line
    assert not (tmp_path / "sweep").exists()


def test_specforge_exports_are_byte_identical_across_runs_and_resumes(finished, tmp_path):
    runs = {name: tmp_path / name for name in ("first", "second", "resumed")}
    for name in ("first", "second"):
        assert export(finished, runs[name]).returncode == ExitCode.OK
    killed = export(finished, runs["resumed"], fault="kill@rename:data_0000000002.ckpt")
    assert killed.returncode == -signal.SIGKILL and not (runs["resumed"] / "export.json").exists()
    resumed = export(finished, runs["resumed"])
    assert resumed.returncode == ExitCode.OK and "3 finished earlier" in resumed.stdout, output(resumed)
    first = digests(runs["first"])
    assert len([f for f in first if f.endswith(".ckpt")]) == 6
    assert digests(runs["second"]) == first and digests(runs["resumed"]) == first
