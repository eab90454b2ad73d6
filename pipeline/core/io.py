"""Small file helpers every writer uses: atomic replace, the mode finished files get, sha256 of files and JSON, and
the one bounded read of a small file a user names (a key, a JSON document)."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from pipeline.core.faults import fault_point

_CHUNK = 8 << 20


def read_bounded(path: Path, max_bytes: int) -> bytes:
    """At most `max_bytes` + 1 bytes of the regular file `path` (one byte more than the bound tells a file that is
    too large); OSError naming it for anything else: a FIFO would block the command forever, a device such as
    /dev/zero never ends (memory exhausted), a directory has no bytes."""
    mode = os.stat(path).st_mode  # follows a symlink: a link to a regular file is read
    if not stat.S_ISREG(mode):
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    with open(path, "rb") as f:
        return f.read(max_bytes + 1)


def sha256_file(path: Path, limit: int | None = None) -> str:
    """sha256 of a file's bytes (its first `limit` bytes when given)."""
    digest = hashlib.sha256()
    remaining = limit
    with open(path, "rb") as f:
        while block := f.read(_CHUNK if remaining is None else min(_CHUNK, remaining)):
            digest.update(block)
            if remaining is not None:
                remaining -= len(block)
                if remaining <= 0:
                    break
    return digest.hexdigest()


def sha256_json(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def _umask() -> int:
    mask = os.umask(0)  # the only way to read it sets it: done once, at import, before any writer thread exists
    os.umask(mask)
    return mask


# mkstemp creates files 0600; a finished file gets the mode open() would have given it, so a trainer running as
# another user of the cluster can read the run.
FILE_MODE = 0o666 & ~_umask()


@contextmanager
def atomic_path(final: Path, publish: Callable[[Path, Path], None] = os.replace) -> Iterator[Path]:
    """Yield a temp path beside `final`; on success fsync and rename it over `final` (`publish(tmp, final)`: another
    way to put it in place, e.g. a create-only link), on failure remove it.

    The temp file lives in the same directory so os.replace is an atomic rename, and a reader never sees a
    half-written file under the final name. An OSError that names no file (a full disk during a write) is raised
    again naming `final`.
    """
    final = Path(final)
    tmp_path: Path | None = None
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
        os.close(fd)
        tmp_path = Path(tmp)
        yield tmp_path
        with open(tmp_path, "rb+") as f:
            os.fsync(f.fileno())
        fault_point("write", final.name)
        os.chmod(tmp_path, FILE_MODE)
        publish(tmp_path, final)
        fault_point("rename", final.name)
    except OSError as e:
        if e.filename is None:
            raise OSError(e.errno, e.strerror, str(final)) from e
        raise
    finally:
        if tmp_path is not None:
            tmp_path.unlink(missing_ok=True)


def write_text_atomic(final: Path, text: str) -> None:
    with atomic_path(final) as tmp:
        tmp.write_text(text, encoding="utf-8")
