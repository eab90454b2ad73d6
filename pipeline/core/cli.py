"""The command-line contract every entry point keeps: one exit code per kind of outcome, and the errors that carry it.

A scheduler or a script reads the exit code alone, so the same outcome has the same code in every command (the table
is in README.md, "Exit codes"): FAILED is worth rerunning (the run resumes), USAGE is not until the input or the
configuration changes, REFUSED means a check looked at the data and said no (its report or lines say why).
"""
from __future__ import annotations

import errno
import signal
import sys
import threading
from enum import IntEnum
from typing import Callable, ClassVar

INTERRUPTED_LINE = "interrupted; rerun the same command to resume"


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1  # stopped for a runtime cause (units failed, an I/O error, a lost lock): rerun the same command
    USAGE = 2  # bad arguments, configuration or input: nothing was done; rerunning unchanged cannot succeed
    REFUSED = 3  # a check said no: the diff gate, a failed comparison, a run that does not verify, a doctor mismatch
    INTERRUPTED = 130  # 128 + SIGINT (Ctrl-C), the shell's convention
    TERMINATED = 143  # 128 + SIGTERM (a scheduler's stop)


class PipelineError(Exception):
    """An outcome an entry point reports in one line, exiting with the class's `exit_code`."""

    exit_code: ClassVar[ExitCode] = ExitCode.FAILED


class UsageError(PipelineError):
    """Bad arguments, configuration or input, found before anything was written."""

    exit_code = ExitCode.USAGE


class Refused(PipelineError):
    """A check that ran and did not pass."""

    exit_code = ExitCode.REFUSED


class RunFailed(PipelineError):
    """A run that stopped for a runtime cause; what it finished is kept and a rerun resumes it."""

    exit_code = ExitCode.FAILED


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so that context managers close engines and locks as Ctrl-C does. A
    BaseException, like KeyboardInterrupt, so that no `except Exception` recording an engine's failure swallows it."""


def os_error_text(e: OSError) -> str:
    """`path: strerror (ERRNO)`: what an OSError says in one line, without its traceback."""
    what = errno.errorcode.get(e.errno, "") if e.errno is not None else ""
    where = f"{e.filename}: " if e.filename else ""
    return f"{where}{e.strerror or e} ({what or type(e).__name__})"


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


def run_command(body: Callable[[], int | None]) -> int:
    """`body`'s exit code (None: OK). A PipelineError or an OSError is one `error: ...` line and its code; Ctrl-C and
    SIGTERM are one line and 130 / 143 instead of a traceback or silence. SystemExit passes through: the Hydra entry
    points exit from inside Hydra's job (which reports its own errors before they could reach here)."""
    in_main = threading.current_thread() is threading.main_thread()  # signal handlers can only be set there
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if in_main else None
    try:
        code = body()
    except PipelineError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except OSError as e:  # a full disk, a failing device, a path that is not what it should be
        print(f"error: {os_error_text(e)}", file=sys.stderr)
        return ExitCode.FAILED
    except KeyboardInterrupt:
        print(INTERRUPTED_LINE, file=sys.stderr)
        return ExitCode.INTERRUPTED
    except Terminated:
        print(INTERRUPTED_LINE, file=sys.stderr)
        return ExitCode.TERMINATED
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)
    return ExitCode.OK if code is None else int(code)
