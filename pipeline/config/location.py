"""What a job whose `out_dir` or `data.path` may be on object storage checks before it reads anything, the same for
extract, regenerate and the diff: the endpoint (no credentials in it), the output prefix when it is a URL (the bucket
usable, no finished directory of the job's kind there without overwrite), then `data.path` in a bucket copied into the
local spool and read from there."""
from __future__ import annotations

from typing import Any, Protocol, TypeVar

from pipeline.config.checks import check_endpoint
from pipeline.core.lifecycle import DirKind
from pipeline.core.storage import SCHEME
from pipeline.core.store_dir import check_early
from pipeline.data.from_store import with_local_data


class Located(Protocol):
    """The fields of a job's config that say where it reads and writes."""

    out_dir: str
    spool_dir: str
    s3_endpoint: str | None
    data: Any


C = TypeVar("C", bound=Located)


def checked_locations(cfg: C, kind: DirKind | None, *, overwrite: bool = False) -> C:
    """`cfg` with `data.path` read from its local copy when it is in a bucket; refused in one line first when the
    endpoint, or `out_dir` on a store for a job writing a directory of `kind` (None: a job whose out_dir is local),
    cannot be used."""
    check_endpoint(cfg.s3_endpoint)
    if kind is not None and SCHEME.match(cfg.out_dir):
        check_early(cfg.out_dir, kind=kind, overwrite=overwrite, endpoint=cfg.s3_endpoint)
    return with_local_data(cfg)
