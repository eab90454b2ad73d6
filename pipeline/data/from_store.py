"""A job's data on object storage (`data.path=s3://bucket/prompts.jsonl`, or the prefix of a finished regeneration):
copied into the node's spool once, then read from there as the local path it stands for.

Data is small beside the states it yields (text and token ids), and every reader of it reads local files (a prompt
file's formats and compressions recognised by content, Parquet footers; a regeneration's parts, each checked against
the sha256 its manifest lists). The copy is complete before it is used (downloaded beside it, then renamed into
place), and kept for a rerun while the objects keep their sizes and ETags; sample ids derive from the content, so the
copy reads as the same data as the original on disk."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from pipeline.core.storage import SCHEME, ObjectInfo, StorageError
from pipeline.core.store_copy import copied
from pipeline.core.stores import open_store
from pipeline.data.regeneration import LAYOUT, MANIFEST, START_FILE

C = TypeVar("C")


def with_local_data(cfg: C) -> C:
    """`cfg` (a job's config with `data`, `spool_dir` and `s3_endpoint`) with `data.path` read from its local copy
    when it is on object storage; `cfg` itself otherwise."""
    path = cfg.data.path  # type: ignore[attr-defined]
    if not SCHEME.match(path):
        return cfg
    local = local_copy(path, cfg.spool_dir, cfg.s3_endpoint)  # type: ignore[attr-defined]
    return replace(cfg, data=replace(cfg.data, path=str(local)))  # type: ignore[attr-defined]


def local_copy(url: str, spool_root: str, endpoint: str | None) -> Path:
    """The local copy of the data file or regeneration at `url`, made when there is none of these very objects."""
    store = open_store(url, endpoint=endpoint)  # an unsupported scheme is refused here, naming it
    store.check()  # no such bucket, credentials refused, an endpoint that does not answer: one line naming it
    listing = {o.key: o for o in store.list()}
    name = url.rstrip("/").rsplit("/", 1)[-1]
    if listing:
        objects = _regeneration(url, listing)
    else:  # no prefix of that name: an object (the prompt file)
        if url.rstrip("/").count("/") < 3:
            raise StorageError(f"data.path={url!r} names a bucket, not a data file or a regeneration under it")
        store = open_store(url.rstrip("/").rsplit("/", 1)[0], endpoint=endpoint)
        info = store.head(name)
        if info is None:
            raise StorageError(f"data.path={url!r}: there is no such object (nor a regeneration under that prefix)")
        objects = {name: info}
    return copied(store, url, name, objects, spool_root, prefix=bool(listing))


def _regeneration(url: str, listing: dict[str, ObjectInfo]) -> dict[str, ObjectInfo]:
    """The objects of a finished regeneration that a reader reads (its lease and anything it does not write left)."""
    if MANIFEST not in listing:
        what = ("an unfinished regeneration (no manifest.json): rerun the same pipeline.regenerate command to finish "
                "it") if START_FILE in listing else "no regeneration (no manifest.json) and no data file"
        raise StorageError(f"data.path={url!r} holds {what}")
    return {key: listing[key] for key in LAYOUT.read_keys(listing)}
