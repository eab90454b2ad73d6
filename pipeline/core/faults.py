"""Fault injection at the run's write steps, for the reliability tests: every write or rename of a run's files calls
`fault_point(phase, name)`, which does nothing unless the environment asks for a fault there.

    PIPELINE_FAULT="kill@rename:manifest.json"       the process kills itself (SIGKILL) right after that rename
    PIPELINE_FAULT="enospc@write:shard-00001.*"       that write fails with ENOSPC (also eio, erofs, eacces)
    PIPELINE_FAULT="pause=/tmp/go@write:manifest.json" waits there until the file /tmp/go exists
    PIPELINE_FAULT="bug@write:run.json"               raises InjectedBug there: an exception no check anticipated
    PIPELINE_FAULT_TRACE=/tmp/steps.txt               appends every step ("write:run.json") to that file

A step is `phase:file name` (phases: write = the temp file is complete, rename = it is in place, unlink, remove,
part = one part of a multipart upload to object storage is sent;
and `start:<command>`, a command's first step, before its imports: pipeline.core.cli); the name may be a glob. `#N` after the step picks its N-th occurrence (1-based; default the first).
"""
from __future__ import annotations

import errno
import fnmatch
import os
import signal
import time
from collections import Counter

FAULT_ENV, TRACE_ENV = "PIPELINE_FAULT", "PIPELINE_FAULT_TRACE"
_ERRORS = {"enospc": errno.ENOSPC, "eio": errno.EIO, "erofs": errno.EROFS, "eacces": errno.EACCES}
_seen: Counter[str] = Counter()


class InjectedBug(Exception):
    """What a bug raises, at a chosen step: the entry points show its traceback and exit BUG, not a resumable FAILED."""


def fault_point(phase: str, name: str) -> None:
    step = f"{phase}:{name}"
    trace = os.environ.get(TRACE_ENV)
    if trace:
        with open(trace, "a", encoding="utf-8") as f:
            f.write(step + "\n")
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    action, _, where = spec.partition("@")
    pattern, _, nth = where.partition("#")
    if not fnmatch.fnmatchcase(step, pattern):
        return
    _seen[pattern] += 1
    if _seen[pattern] != int(nth or 1):
        return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action in _ERRORS:
        code = _ERRORS[action]
        raise OSError(code, os.strerror(code))  # as a failing write() raises it: the writer names the file
    elif action == "bug":
        raise InjectedBug(f"injected at {step}")
    elif action.startswith("pause="):
        release = action.removeprefix("pause=")
        while not os.path.exists(release):
            time.sleep(0.05)
    else:
        raise ValueError(f"{FAULT_ENV}={spec!r}: unknown action {action!r}")
