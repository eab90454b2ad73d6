"""Objects of a store copied into the local spool for readers that read local files (a job's data on object storage,
an export a trainer reads): the copy is complete before it is used (downloaded beside it, then renamed into place),
and kept for a rerun while the objects keep their sizes and ETags; an older copy of the same URL is removed once a
newer one is in place."""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from pipeline.core.storage import ObjectInfo, Store, StorageError, download


def copied(store: Store, url: str, name: str, objects: dict[str, ObjectInfo], spool_root: str, *,
            prefix: bool) -> Path:
    """`<spool>/data/<url's digest>/<objects' digest>/<name>`: an earlier copy of the same objects is used as it is;
    a copy of other versions is removed once this one is in place."""
    versions = Path(spool_root).expanduser() / "data" / _digest(f"{getattr(store, 'endpoint_url', None)} {url}")
    these = versions / _digest(" ".join(f"{k}:{o.size}:{o.etag}" for k, o in sorted(objects.items())))
    if not (these / name).exists():
        scratch = versions / f".incoming-{os.getpid()}"
        try:
            shutil.rmtree(scratch, ignore_errors=True)
            for key, info in objects.items():
                download(store, key, scratch / name / key if prefix else scratch / key, info.size)
        except OSError as e:
            shutil.rmtree(scratch, ignore_errors=True)
            raise StorageError(f"spool_dir={spool_root!r} cannot hold the copy of {url} read from there: "
                               f"{e.strerror or e}") from None
        try:
            scratch.rename(these)
        except OSError:  # another job copied the same objects meanwhile
            shutil.rmtree(scratch, ignore_errors=True)
    for other in versions.iterdir():
        if other != these and not other.name.startswith(".incoming-"):
            shutil.rmtree(other, ignore_errors=True)
    return these / name


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]
