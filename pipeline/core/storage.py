"""Where a directory's files live, behind one small interface: the local file system, or an object store (`s3://`).

A `Store` is a flat namespace of keys under one root (a directory, or a bucket and prefix) with the few operations
the output-directory machinery needs, each with the same meaning on both:
- `put(key, data, create=True)`: a create-only write; `Exists` when the key is there (S3: `If-None-Match: *`). This is
  what lets "units first, the completing file last" hold without a rename, and what makes one racer of two win;
- `put(key, data, match=etag)`: a write only over that very version; `Stale` otherwise (S3: `If-Match`). A lease is
  renewed and taken over with it;
- `upload(key, path)`: a large local file, create-only (S3: a multipart upload whose completion is create-only; an
  upload cut short is resumed from its finished parts, `abort_unfinished` removes what an abandoned one left);
- `get(key, start, end)`: a ranged read (a sample of a shard, not the shard), `head`, `list`, `delete`.
The stores are `pipeline.core.local_store.LocalStore` and `pipeline.core.s3.S3Store`; `pipeline.core.stores.open_store`
picks one from the location a user gave. Nothing here knows a kind of directory.
"""
from __future__ import annotations

import argparse
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Protocol, TypeVar

from pipeline.core.cli import RunFailed, UsageError

SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# A URL a path has already swallowed: Path("s3://b/r") is `s3:/b/r`.
_MANGLED = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:/")


class StorageError(UsageError):
    """A location that cannot be used as given (no such bucket, credentials refused, an endpoint that does not
    answer, a URL this project does not read): nothing was written."""

    prefix = "storage error"


class StorageFailed(RunFailed):
    """A storage request that failed mid-job (a timeout, a server error): what was finished is kept; rerun."""


class Exists(Exception):
    """A create-only write found the key already there."""


class Stale(Exception):
    """A write conditional on a version found another version (or none)."""


@dataclass(frozen=True)
class ObjectInfo:
    key: str  # relative to the store's root
    size: int
    etag: str  # the version a conditional write names
    age: float  # seconds since it was last written, by the store's own clock (S3: the server's)


class Store(Protocol):
    url: str  # names the location in messages: never a credential

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes: ...
    def head(self, key: str) -> ObjectInfo | None: ...
    def list(self, prefix: str = "") -> list[ObjectInfo]: ...
    def put(self, key: str, data: bytes, *, create: bool = False, match: str | None = None) -> str: ...
    def upload(self, key: str, path: Path) -> ObjectInfo: ...
    def delete(self, key: str, *, match: str | None = None) -> None: ...
    def abort_unfinished(self, prefix: str = "") -> list[str]: ...


CHUNK_BYTES = 32 << 20  # one ranged GET of `chunks`: what reading an object whole holds in memory


def chunks(store: Store, key: str, size: int) -> Iterator[bytes]:
    """The object `key` of `size` bytes, in order, by ranged reads of CHUNK_BYTES (memory bounded by one chunk,
    whatever the object's size)."""
    for start in range(0, size, CHUNK_BYTES):
        yield store.get(key, start, min(size, start + CHUNK_BYTES))


# Round trips a reader keeps in flight (a resume judging the finished units, a reader opening the shards' indexes):
# a few ms each on loopback, tens across a network, so thousands of them one at a time are minutes. The S3 client's
# connection pool holds these besides an upload's parts (pipeline/core/s3.py).
REQUESTS_AT_ONCE = 8
# Ranged reads of one object in flight at once when it is copied to a file: a connection to S3 carries about 100 MB/s,
# so a verify or a copy of a large object reads several ranges at once. With CHUNK_BYTES, what a copy holds in memory.
DOWNLOAD_THREADS = 4
_T, _R = TypeVar("_T"), TypeVar("_R")


def in_order(fn: Callable[[_T], _R], items: Iterable[_T], *, threads: int = REQUESTS_AT_ONCE,
             name: str = "requests") -> Iterator[_R]:
    """`fn(item)` for every item, `threads` at once, yielded in the items' order; an item's exception is raised at
    its turn (the items after it may have run)."""
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name) as pool:
        yield from pool.map(fn, items)


def download(store: Store, key: str, path: Path, size: int) -> None:
    """The object `key` of `size` bytes into the file `path`, by ranged reads of CHUNK_BYTES, DOWNLOAD_THREADS at
    once, each written at its offset (memory bounded by DOWNLOAD_THREADS chunks, whatever the object's size).
    StorageFailed when the object is no longer `size` bytes (replaced since it was listed): no silently short or
    truncated copy."""
    path.parent.mkdir(parents=True, exist_ok=True)

    def read(start: int) -> bytes:
        end = min(size, start + CHUNK_BYTES)
        data = store.get(key, start, end + (end == size))  # one byte past the end: an object grown since is seen
        if len(data) != end - start:
            raise StorageFailed(f"{store.url}/{key}: {'more' if len(data) > end - start else 'fewer'} bytes than the "
                                f"{size} it had when listed: the object changed while it was copied; rerun")
        return data

    with open(path, "wb") as f:
        if size <= CHUNK_BYTES:
            f.write(read(0))
            return
        for _ in in_order(lambda start: os.pwrite(f.fileno(), read(start), start), range(0, size, CHUNK_BYTES),
                          threads=DOWNLOAD_THREADS, name="download"):
            pass


def is_url(location: str | os.PathLike) -> bool:
    """Whether `location` is a URL (`s3://...`, `gs://...`, or one a Path already read as `s3:/...`), not a path."""
    return bool(_MANGLED.match(str(location)))


def not_local(location: str | os.PathLike) -> str | None:
    """Why `location` cannot be read as a local path (a URL would otherwise become the relative directory
    `./s3:/b/r`), or None."""
    if not is_url(location):
        return None
    return ("is a URL; this command reads and writes local paths only so far (a mounted volume works): copy the data "
            "to a local or mounted path")


def path_arg(text: str) -> Path:
    """An argparse `type` for a local path: a URL is refused as a usage error naming it."""
    if (why := not_local(text)) is not None:
        raise argparse.ArgumentTypeError(f"{text!r} {why}")
    return Path(text)


def location_arg(text: str) -> Path | str:
    """An argparse `type` for a local path or an `s3://` URL (kept a string: a Path would read it as `s3:/...`)."""
    return text if SCHEME.match(text) else path_arg(text)
