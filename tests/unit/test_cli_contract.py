"""The CLI contract's parts (pipeline/core/cli.py): which code each error class carries, and what `run_command` makes
of errors and signals. The entry points' own codes, end to end: tests/reliability/test_exit_codes.py."""
from __future__ import annotations

import errno
import os
import signal
import time

import pytest

from pipeline.config import ConfigError
from pipeline.core.cli import INTERRUPTED_LINE, ExitCode, PipelineError, run_command
from pipeline.drafts.checkpoint import DraftError
from pipeline.drafts.flags import FlagsError
from pipeline.drafts.target import TargetError
from pipeline.engines.base import EngineStartError
from pipeline.exports.slots import ExportError, RunDoesNotVerify
from pipeline.run.executor import UnitsFailed
from pipeline.run.gate import DiffGateError
from pipeline.data.prepare import NoValidRecords
from pipeline.shards.manifest import ManifestError


@pytest.mark.parametrize("error, code", [
    (ConfigError, ExitCode.USAGE), (ManifestError, ExitCode.USAGE), (ExportError, ExitCode.USAGE),
    (DraftError, ExitCode.USAGE), (TargetError, ExitCode.USAGE), (FlagsError, ExitCode.USAGE),
    (EngineStartError, ExitCode.USAGE), (NoValidRecords, ExitCode.USAGE),
    (DiffGateError, ExitCode.REFUSED), (RunDoesNotVerify, ExitCode.REFUSED),
    (UnitsFailed, ExitCode.FAILED),
])
def test_each_error_carries_its_outcomes_code(error, code):
    assert issubclass(error, PipelineError) and error.exit_code == code


def test_a_run_that_does_not_verify_is_still_an_export_error():
    """Caught where ExportError is caught; only its code says 'refused by a check' rather than 'usage'."""
    assert issubclass(RunDoesNotVerify, ExportError) and RunDoesNotVerify("x").exit_code == ExitCode.REFUSED


def _raise(exc: BaseException):
    def body():
        raise exc
    return body


@pytest.mark.parametrize("exc, code, line", [
    (RunDoesNotVerify("run r does not verify"), ExitCode.REFUSED, "error: run r does not verify"),
    (ConfigError("data.limit=0: must be >= 1"), ExitCode.USAGE, "error: data.limit=0: must be >= 1"),
    (OSError(errno.ENOSPC, "No space left on device", "/out/f"), ExitCode.FAILED,
     "error: /out/f: No space left on device (ENOSPC)"),
    (KeyboardInterrupt(), ExitCode.INTERRUPTED, INTERRUPTED_LINE),
])
def test_run_command_makes_one_line_and_the_code(capsys, exc, code, line):
    assert run_command(_raise(exc)) == code
    assert capsys.readouterr().err.splitlines() == [line]


def test_run_command_passes_the_bodys_code_and_exits():
    assert run_command(lambda: None) == ExitCode.OK and run_command(lambda: ExitCode.REFUSED) == ExitCode.REFUSED
    with pytest.raises(SystemExit):  # argparse's usage errors and the Hydra jobs' exits go through unchanged
        run_command(_raise(SystemExit(2)))


def test_sigterm_ends_the_body_with_143_and_the_handler_is_restored(capsys):
    before = signal.getsignal(signal.SIGTERM)

    def body():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # interrupted by the handler's exception; the test would take 30 s otherwise

    started = time.monotonic()
    assert run_command(body) == ExitCode.TERMINATED and time.monotonic() - started < 10
    assert capsys.readouterr().err.splitlines() == [INTERRUPTED_LINE]
    assert signal.getsignal(signal.SIGTERM) is before
