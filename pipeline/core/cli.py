"""The command-line contract every entry point keeps: one exit code per kind of outcome, and the errors that carry it.

A scheduler or a script reads the exit code alone, so the same outcome has the same code in every command (the table
is in docs/reference/exit-codes.md): FAILED is worth rerunning (the run resumes), USAGE is not until the input or the
configuration changes, REFUSED means a check looked at the data and said no (its report or lines say why), BUG is an
exception no check anticipated: its traceback is shown, and no scheduler should rerun it as if it were resumable.
"""
from __future__ import annotations

import errno
import os
import signal
import sys
import threading
import traceback
from enum import IntEnum
from pathlib import Path
from typing import Callable, ClassVar

from pipeline.core.faults import fault_point

INTERRUPTED_LINE = "interrupted; rerun the same command to resume"
BUG_LINE = ("unexpected {kind}: a bug in the pipeline, not a resumable stop (rerunning will not help; please report "
            "it with its traceback)")


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1  # stopped for a runtime cause (units failed, an I/O error, a lost lock): rerun the same command
    USAGE = 2  # bad arguments, configuration or input: nothing was done; rerunning unchanged cannot succeed
    REFUSED = 3  # a check said no: the diff gate, a failed comparison, a run that does not verify, a doctor mismatch
    BUG = 70  # an unexpected exception (sysexits' EX_SOFTWARE): its traceback says where; rerunning will not help
    INTERRUPTED = 130  # 128 + SIGINT (Ctrl-C), the shell's convention
    TERMINATED = 143  # 128 + SIGTERM (a scheduler's stop)


class PipelineError(Exception):
    """An outcome an entry point reports in one line, exiting with the class's `exit_code`."""

    exit_code: ClassVar[ExitCode] = ExitCode.FAILED
    prefix: ClassVar[str] = ""  # the line's first words where the message alone does not say what stopped
    nothing_written: ClassVar[bool] = False  # raised before a job wrote anything (an engine that did not start)



class UsageError(PipelineError):
    """Bad arguments, configuration or input, found before anything was written."""

    exit_code = ExitCode.USAGE


class ConfigError(UsageError, ValueError):
    """A configuration that cannot run; raised before any model is loaded, naming the field and the value."""

    prefix = "configuration error"


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


_SIGNAL_CODES = {signal.SIGINT: ExitCode.INTERRUPTED, signal.SIGTERM: ExitCode.TERMINATED}


def _exit_at_once(signum: int, frame: object) -> None:
    """Outside a command's body (its imports, its interpreter's exit) there is nothing to close: what was printed,
    the line, and the code, at once (os._exit: no KeyboardInterrupt unwinding through importlib's frames)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a stream being written when the signal came (a reentrant flush), or closed
            pass
    os.write(2, f"{INTERRUPTED_LINE}\n".encode())
    os._exit(_SIGNAL_CODES[signal.Signals(signum)])


def _set(signum: signal.Signals, handler: Callable[[int, object], None]) -> object:
    """Install `handler` unless the signal is ignored (a shell without job control starts background jobs ignoring
    SIGINT, `nohup`-like launchers SIGTERM): the previous handler, to restore."""
    previous = signal.getsignal(signum)
    if previous is not signal.SIG_IGN:
        signal.signal(signum, handler)
    return previous


def interrupts_from_here(module: str, command: str) -> None:
    """An entry module's first statement, before its imports (torch, transformers, Hydra: seconds): when this process
    is the command (`python -m pipeline.<command>`, or its console script `pipeline-<command>`), Ctrl-C and SIGTERM
    are one line and 130 / 143 from here on, not an import traceback or a silent death; `run_command` makes them
    unwind its body. Imported by another program (a test, a notebook), the module changes no signal handler."""
    if module != "__main__" and Path(sys.argv[0]).name != f"pipeline-{command}":
        return
    for signum in _SIGNAL_CODES:
        _set(signum, _exit_at_once)
    fault_point("start", command)  # the tests' pause: a signal while the imports run


def run_command(body: Callable[[], int | None]) -> int:
    """`body`'s exit code (None: OK). A PipelineError or an OSError is one `error: ...` line and its code; Ctrl-C and
    SIGTERM are one line and 130 / 143 instead of a traceback or silence; any other exception is a bug: its traceback,
    one line saying so, and BUG. SystemExit passes through (a Hydra sweep's job exits with its code). During `body`
    both signals raise in the main thread, so that context managers close engines and locks; before and after it,
    what `interrupts_from_here` installed answers them."""
    in_main = threading.current_thread() is threading.main_thread()  # signal handlers can only be set there
    previous = {}
    if in_main:
        previous = {signal.SIGINT: _set(signal.SIGINT, signal.default_int_handler),
                    signal.SIGTERM: _set(signal.SIGTERM, _raise_terminated)}
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
    except Exception as e:  # noqa: BLE001 - a bug: shown whole, and never the resumable exit status
        traceback.print_exception(e, file=sys.stderr)
        print(f"error: {BUG_LINE.format(kind=type(e).__name__)}", file=sys.stderr)
        return ExitCode.BUG
    finally:
        for signum, handler in previous.items():
            if handler not in (signal.SIG_IGN, None):  # None: a handler not set from Python
                signal.signal(signum, handler)
    return ExitCode.OK if code is None else int(code)
