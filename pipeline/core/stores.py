"""The store at a location a user gave: `s3://bucket/prefix` or a local directory."""
from __future__ import annotations

import os
from pathlib import Path

from pipeline.core.local_store import LocalStore
from pipeline.core.storage import SCHEME, Store, StorageError, is_url


def store_of(location: str | os.PathLike) -> Store | None:
    """The store of an object-storage URL (a string); None for a local path, read as today."""
    return open_store(location) if isinstance(location, str) and SCHEME.match(location) else None


def open_store(location: str | os.PathLike, *, endpoint: str | None = None) -> Store:
    """The store at `location`: `s3://bucket/prefix` (endpoint and credentials the standard AWS way, or `endpoint`),
    else a local directory."""
    match = SCHEME.match(str(location))
    if match is None:
        if is_url(location):  # Path("s3://b/r") is s3:/b/r: a URL already read as a path
            raise StorageError(f"{str(location)!r} is a URL read as a path; give it as a string")
        return LocalStore(Path(location))
    if match.group(1).lower() != "s3":
        raise StorageError(f"{str(location)!r}: object storage is read as s3://bucket/prefix; the scheme "
                           f"{match.group(1)!r} is not supported")
    from pipeline.core.s3 import S3Store  # boto3 is imported only by a job that uses object storage

    return S3Store(str(location), endpoint=endpoint)
