"""Every entry point's exit codes (pipeline/core/cli.py; the table in docs/reference/exit-codes.md), from the real
commands on real files: each kind of outcome has the same code in every command, said in one line without a traceback.

    0 OK   1 FAILED (a runtime cause: rerun resumes)   2 USAGE (arguments, configuration, input)
    3 REFUSED (a check said no)   70 BUG (an unexpected exception: its traceback)   130 / 143 Ctrl-C / SIGTERM
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.cli import INTERRUPTED_LINE, ExitCode
from tests.helpers import REPO
from tests.helpers.cli import cli
from tests.helpers.drafts import make_draft
from tests.helpers.runs import SMALL, env_with, extract, output, wait_for_step

pytestmark = pytest.mark.reliability
PROBE = ("diff.probe.num_samples=3", "diff.probe.max_tokens=64")
TIGHT = "diff.thresholds.bfloat16.rel_l2=0"  # bf16 rounding alone is above it: a comparison cannot pass


def said(done: subprocess.CompletedProcess, text: str) -> str:
    """The one line holding `text`; nothing printed a traceback."""
    lines = [line for line in output(done).splitlines() if text in line]
    assert len(lines) == 1 and "Traceback" not in output(done), output(done)[-3000:]
    return lines[0]


def tampered(run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "tampered"
    shutil.copytree(run, copy)
    (copy / "notes.txt").write_text("not a file a run writes")
    return copy


@pytest.mark.parametrize("overrides, fault, code, line", [
    (("runner.max_tokens_per_shard=abc",), None, ExitCode.USAGE,
     "configuration error: Error merging override runner.max_tokens_per_shard=abc"),
    (("engine=nosuch",), None, ExitCode.USAGE, "configuration error: In 'config': Could not find 'engine/nosuch'"),
    ((TIGHT, "data.limit=6"), None, ExitCode.REFUSED, "stopped by the diff gate"),
    (SMALL, "enospc@write:run.json", ExitCode.FAILED, "No space left on device (ENOSPC)"),
], ids=["wrong-type", "no-such-group-option", "gate", "full-disk"])
def test_extract(tmp_path, overrides, fault, code, line):
    done = extract(tmp_path / "run", *overrides, fault=fault)
    assert done.returncode == code, output(done)[-3000:]
    said(done, line)
    assert not (tmp_path / "run" / "manifest.json").exists()


@pytest.mark.parametrize("overrides, fault, code, line", [
    (PROBE, None, ExitCode.OK, "report.html ("),  # bf16 against float32 on the tiny default: a warning, no failure
    (("diff.points=some",), None, ExitCode.USAGE, "configuration error: diff.points='some'"),
    ((*PROBE, TIGHT), None, ExitCode.REFUSED, "report.html ("),
    (PROBE, "enospc@write:report.json", ExitCode.FAILED, "report.json: No space left on device (ENOSPC)"),
], ids=["pass-or-warn", "config", "comparison-failed", "full-disk"])
def test_diff(tmp_path, overrides, fault, code, line):
    done = cli("pipeline.diff", f"out_dir={tmp_path / 'out'}", f"hydra.run.dir={tmp_path / 'logs'}", *overrides,
               env={"PIPELINE_FAULT": fault} if fault else None)
    assert done.returncode == code, output(done)[-3000:]
    said(done, line)


def is_a_bug(done: subprocess.CompletedProcess) -> None:
    """An exception no check anticipated: its traceback, one line saying it is a bug, and BUG, never the resumable
    FAILED (a scheduler would rerun it for days)."""
    text = output(done)
    assert done.returncode == ExitCode.BUG, text[-3000:]
    assert "Traceback" in text and "InjectedBug: injected at write:" in text, text[-3000:]
    assert "unexpected InjectedBug: a bug in the pipeline, not a resumable stop" in text
    assert "rerun the same command to resume" not in text


@pytest.mark.parametrize("command, step", [("extract", "write:run.json"), ("regenerate", "write:regen.json")])
def test_an_unexpected_exception_in_a_hydra_job_is_a_bug_with_its_traceback(tmp_path, command, step):
    done = cli(f"pipeline.{command}", f"out_dir={tmp_path / 'out'}", f"hydra.run.dir={tmp_path / 'logs'}",
               *(SMALL if command == "extract" else ("data.limit=2", "sampling.max_tokens=4")),
               env={"PIPELINE_FAULT": f"bug@{step}"})
    is_a_bug(done)


def test_an_unexpected_exception_in_a_plain_command_is_a_bug_with_its_traceback(finished, tmp_path):
    is_a_bug(cli("pipeline.export", str(finished), "--format", "specforge", "--out", str(tmp_path / "out"),
                 env={"PIPELINE_FAULT": "bug@write:data_*.ckpt"}))


def test_the_factory_builds_nothing_for_a_config_that_fails_validation(tmp_path):
    """The typed config is checked before the job's first step (the tiny model's build) runs."""
    models = tmp_path / "models"
    for command, bad in [("extract", "engine.batch_size=0"), ("regenerate", "engine.batch_size=0"),
                         ("diff", "diff.probe.num_samples=0")]:
        done = cli(f"pipeline.{command}", bad, f"out_dir={tmp_path / command}", f"hydra.run.dir={tmp_path / 'logs'}",
                   env={"PIPELINE_MODELS_DIR": str(models)})
        assert done.returncode == ExitCode.USAGE, output(done)[-3000:]
        said(done, f"configuration error: {bad.split('=')[0]}=")
        assert not models.exists() or not any(models.iterdir()), sorted(models.rglob("*"))
        assert not (tmp_path / command).exists()


def test_verify(finished, tmp_path):
    assert cli("pipeline.verify", str(finished)).returncode == ExitCode.OK
    (tmp_path / "half").mkdir()
    unfinished = cli("pipeline.verify", str(tmp_path / "half"))
    assert unfinished.returncode == ExitCode.USAGE and said(unfinished, "error: unfinished run")
    refused = cli("pipeline.verify", str(tampered(finished, tmp_path)))
    assert refused.returncode == ExitCode.REFUSED and said(refused, "unknown file notes.txt")


def test_export(finished, tmp_path):
    def export(run: Path, out: str, *args: str, fault: str | None = None) -> subprocess.CompletedProcess:
        return cli("pipeline.export", str(run), "--format", "specforge", "--out", str(tmp_path / out), *args,
                   env={"PIPELINE_FAULT": fault} if fault else None)

    assert export(finished, "ok").returncode == ExitCode.OK
    usage = export(finished, "usage", "--aux", "b2,b4,b7")  # the run captured b1, b4, b7
    assert usage.returncode == ExitCode.USAGE and said(usage, "error: --aux: b2 not captured")
    refused = export(tampered(finished, tmp_path), "refused")
    assert refused.returncode == ExitCode.REFUSED and said(refused, "does not verify")
    failed = export(finished, "failed", fault="enospc@write:data_*.ckpt")
    assert failed.returncode == ExitCode.FAILED
    assert said(failed, "No space left").startswith("error: ") and "data_0000000000.ckpt: " in said(failed, "ENOSPC")
    resumed = export(finished, "failed")
    assert resumed.returncode == ExitCode.OK and "finished earlier" in resumed.stdout, output(resumed)


def test_doctor(models_root, tmp_path):
    llama = json.loads((models_root / "tiny-llama" / "config.json").read_text())
    fits = make_draft(tmp_path / "fits", llama, aux_ids=[0, 2, 4], draft_vocab=1024)
    other_vocab = make_draft(tmp_path / "other", llama, aux_ids=[0, 2, 4], draft_vocab=1024, vocab_size=5000)

    def doctor(*args: str) -> subprocess.CompletedProcess:
        return cli("pipeline.doctor", "--serve", "sglang", "--no-load", *args)

    target = ("--target", str(models_root / "tiny-llama"))
    assert doctor("--draft", str(fits), *target).returncode == ExitCode.OK
    refused = doctor("--draft", str(other_vocab), *target)
    assert refused.returncode == ExitCode.REFUSED and said(refused, "MISMATCH vocab")
    usage = doctor("--draft", str(fits))
    assert usage.returncode == ExitCode.USAGE and said(usage, "error: name the target")


def _interruptible(cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
    # SIGINT back to its default: a shell without job control starts background jobs (and their children) ignoring it
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _stop_at(cmd: list[str], step: str, signum: int, tmp_path: Path) -> tuple[int, str]:
    """Run `cmd` until it reaches the write step `step` (held there by a pause fault), send `signum`: (code, stderr)."""
    trace = tmp_path / "steps.txt"
    env = env_with(PIPELINE_FAULT=f"pause={tmp_path / 'never'}@{step}", PIPELINE_FAULT_TRACE=str(trace))
    proc = _interruptible(cmd, env)
    wait_for_step(trace, step, proc)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, ExitCode.INTERRUPTED), (signal.SIGTERM, ExitCode.TERMINATED)])
def test_extract_interrupted(tmp_path, signum, code):
    cmd = [sys.executable, "-m", "pipeline.extract", f"out_dir={tmp_path / 'run'}", f"hydra.run.dir={tmp_path}/logs",
           *SMALL]
    returncode, err = _stop_at(cmd, "write:run.json", signum, tmp_path)
    assert (returncode, err.splitlines()[-1:]) == (code, [INTERRUPTED_LINE]), err[-3000:]
    assert "Traceback" not in err and not (tmp_path / "run" / "manifest.json").exists()


def test_export_terminated_then_resumed(finished, tmp_path):
    cmd = [sys.executable, "-m", "pipeline.export", str(finished), "--format", "specforge", "--out",
           str(tmp_path / "out")]
    returncode, err = _stop_at(cmd, "write:data_0000000001.ckpt", signal.SIGTERM, tmp_path)
    assert (returncode, err.splitlines()[-1:]) == (ExitCode.TERMINATED, [INTERRUPTED_LINE]), err[-3000:]
    assert "Traceback" not in err
    resumed = subprocess.run(cmd, cwd=REPO, env=env_with(), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == ExitCode.OK and "1 finished earlier" in resumed.stdout, output(resumed)


@pytest.mark.parametrize("module, override, line", [  # each with its own config: conf/config.yaml, conf/diff.yaml
    ("pipeline.extract", "runer.x=1", "configuration error: unknown config key runer (did you mean runner?)"),
    ("pipeline.extract", "engine=nosuch", "configuration error: In 'config': Could not find 'engine/nosuch'"),
    ("pipeline.diff", "daat.x=1", "configuration error: unknown config key daat (did you mean data?)"),
    ("pipeline.diff", "model=nosuch", "configuration error: In 'diff': Could not find 'model/nosuch'"),
])
def test_main_called_directly_is_as_strict_as_python_m(tmp_path, module, override, line):
    """Not only under `if __name__ == "__main__"`: main() itself checks the overrides and returns the exit code (a
    console script exits with it), and finds its config from any directory (PYTHONPATH: this checkout's code,
    whichever checkout the environment's editable install is)."""
    done = subprocess.run([sys.executable, "-c", f"import sys; from {module} import main; sys.exit(main())", override,
                           f"out_dir={tmp_path / 'out'}"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == ExitCode.USAGE, output(done)[-3000:]
    assert said(done, "configuration error").startswith(line)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("prompts, why", [("missing.jsonl", "data file not found"), ("folder", "not a regular file"),
                                          ("fifo", "not a regular file"), ("/dev/zero", "not a regular file")])
def test_accept_checks_its_prompts_as_extract_checks_data_path(tmp_path, models_root, prompts, why):
    """A missing file was exit 1, a directory, a FIFO or /dev/zero a traceback (or a hang, or memory exhausted):
    each is one usage line before anything is read or started (#35 item 12)."""
    (tmp_path / "folder").mkdir()
    os.mkfifo(tmp_path / "fifo")
    path = prompts if prompts.startswith("/") else str(tmp_path / prompts)
    done = cli("pipeline.accept", "--draft", str(tmp_path), "--serve", "vllm", "--target",
               str(models_root / "tiny-llama"), "--prompts", path, "--out", str(tmp_path / "out"), timeout=120)
    assert done.returncode == ExitCode.USAGE, output(done)[-3000:]
    assert said(done, f"error: --prompts {path}: ") and why in done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("key", ["/dev/zero", "fifo"])
def test_a_key_path_that_is_no_file_is_one_line_not_a_hang_or_exhausted_memory(finished, tmp_path, key):
    """verify --key and extract's sign_key read the key bounded and only from a regular file (#35 item 3): /dev/zero
    was read until memory ran out, a FIFO blocked forever."""
    if key == "fifo":
        os.mkfifo(tmp_path / "fifo")
        key = str(tmp_path / "fifo")
    verified = cli("pipeline.verify", str(finished), "--key", key, timeout=120)
    assert verified.returncode == ExitCode.USAGE and said(verified, f"error: public key {key}: cannot be read")
    done = extract(tmp_path / "run", *SMALL, f"sign_key={key}", timeout=120)
    assert done.returncode == ExitCode.USAGE, output(done)[-3000:]
    assert said(done, "configuration error") and "cannot be read" in output(done)
    assert not (tmp_path / "run").exists()
