"""The local file system as a `Store` (pipeline/core/storage.py): the same guarantees as object storage's, from POSIX
primitives."""
from __future__ import annotations

import fcntl
import os
import re
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from pipeline.core.io import atomic_path
from pipeline.core.storage import Exists, ObjectInfo, Stale

_TEMP = re.compile(r"\..+\.tmp")  # a write's temp file (io.atomic_path)


class LocalStore:
    """A directory as a store: create-only writes are a hard link of a finished temp file (the link fails when the
    name exists, atomically); a version is the file's inode, size and mtime (every write is a new inode), and a write
    conditional on one holds the directory's flock while it compares and renames."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.url = str(self.root)

    def _path(self, key: str) -> Path:
        if not key or key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"{key!r} is not a key under {self.root}")
        return self.root / key

    @staticmethod
    def _info(key: str, st: os.stat_result) -> ObjectInfo:
        return ObjectInfo(key=key, size=st.st_size, etag=f"{st.st_ino:x}-{st.st_size:x}-{st.st_mtime_ns:x}",
                          age=max(0.0, time.time() - st.st_mtime))

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        with open(self._path(key), "rb") as f:
            f.seek(start)
            return f.read(-1 if end is None else max(0, end - start))

    def head(self, key: str) -> ObjectInfo | None:
        try:
            return self._info(key, os.stat(self._path(key)))
        except FileNotFoundError:
            return None

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """The finished files under `prefix` (a write's temp file is no object, as an S3 upload in flight is none)."""
        return [info for info in self._walk(prefix) if not _TEMP.fullmatch(info.key.rsplit("/", 1)[-1])]

    def _walk(self, prefix: str) -> list[ObjectInfo]:
        found = []
        for folder, _, files in os.walk(self.root):
            for name in files:
                key = os.path.relpath(os.path.join(folder, name), self.root).replace(os.sep, "/")
                if key.startswith(prefix):
                    try:
                        found.append(self._info(key, os.stat(os.path.join(folder, name))))
                    except FileNotFoundError:  # removed since the walk saw it (a temp file renamed)
                        pass
        return sorted(found, key=lambda o: o.key)

    @contextmanager
    def _written(self, key: str, *, create: bool, match: str | None) -> Iterator[tuple[Path, list[str]]]:
        """A temp file for `key` (io.atomic_path: fsync, mode, fault points), put in place create-only (a hard link:
        it fails when the name exists), over the version `match` (compared and renamed under the directory's flock),
        or over anything; yields it and a list that then holds the version written."""
        etag: list[str] = []

        def publish(tmp: Path, final: Path) -> None:
            etag.append(self._info(key, os.stat(tmp)).etag)  # the link and the rename keep inode, size and mtime
            if create:
                try:
                    os.link(tmp, final)
                except FileExistsError:
                    raise Exists(key) from None
            elif match is not None:
                with _dir_lock(final.parent):
                    current = self.head(key)
                    if current is None or current.etag != match:
                        raise Stale(key)
                    os.replace(tmp, final)
            else:
                os.replace(tmp, final)

        with atomic_path(self._path(key), publish) as tmp:
            yield tmp, etag

    def put(self, key: str, data: bytes, *, create: bool = False, match: str | None = None) -> str:
        with self._written(key, create=create, match=match) as (tmp, etag):
            tmp.write_bytes(data)
        return etag[0]

    def upload(self, key: str, path: Path) -> ObjectInfo:
        with self._written(key, create=True, match=None) as (tmp, _):
            shutil.copyfile(path, tmp)
        return self._info(key, os.stat(self._path(key)))

    def delete(self, key: str, *, match: str | None = None) -> None:
        path = self._path(key)
        if match is None:
            path.unlink(missing_ok=True)
            return
        with _dir_lock(path.parent):
            current = self.head(key)
            if current is None or current.etag != match:
                raise Stale(key)
            path.unlink(missing_ok=True)

    def abort_unfinished(self, prefix: str = "") -> list[str]:
        """The temp files writes cut short left (kill -9), removed."""
        left = [o.key for o in self._walk(prefix) if _TEMP.fullmatch(o.key.rsplit("/", 1)[-1])]
        for key in left:
            self._path(key).unlink(missing_ok=True)
        return left


@contextmanager
def _dir_lock(folder: Path) -> Iterator[None]:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
