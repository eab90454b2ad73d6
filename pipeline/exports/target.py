"""Where an export is written: its directory, or a store's prefix (`--out s3://bucket/prefix`), with one contract.

On disk each file is renamed into place complete and export.json is written last (pipeline.exports.sidecar). On a
store the lifecycle is pipeline.core.store_dir's: the lease is an object (`.export.lock`, which no trainer reads: the
trainer's copy leaves it out), the plan the start record a rerun must match; each file is written into the local spool
as on a disk, then uploaded create-only (an object is there only once complete) and removed from the spool, so the
spool holds one sample whatever the export's size; a rerun skips every object already there; export.json goes last,
create-only, after the lease is checked, and the plan object is removed then, as on disk.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator, Mapping

from pipeline.core import lifecycle, store_dir
from pipeline.core.outdir import Layout, json_text, unusable_dir
from pipeline.core.storage import SCHEME, StorageError
from pipeline.core.store_copy import copied
from pipeline.exports import vocab
from pipeline.exports.formats import FORMATS
from pipeline.exports.sidecar import PLAN, SIDECAR, export_dir, export_layout, finish
from pipeline.exports.slots import ExportError

LEASE = ".export.lock"  # on a store only: a directory on disk is locked itself


def on_store(out: Path | str) -> bool:
    return isinstance(out, str) and bool(SCHEME.match(out))


def export_files(files: Layout, *, states: str, draft_vocab: int | None) -> Layout:
    """What an export in the trainer's layout `files` holds: no per-sample folder when the trainer reads the run's
    states (`states="reference"`), speculators' vocabulary files with --draft-vocab N."""
    if states == "reference":
        files = replace(files, dirs={})
    return files if draft_vocab is None else replace(files, files=files.files + vocab.names(draft_vocab))


def check_writable(out: Path | str, spool_root: str) -> None:
    """ExportError in one line when the export cannot be written: a path through a file or a read-only directory on
    disk; on a store, a spool folder that cannot be written (the bucket itself is checked by `found`)."""
    if not on_store(out):
        if (why := unusable_dir(Path(out))) is not None:
            raise ExportError(f"--out {out} {why}")
        return
    store_dir.checked_spool(spool_root, str(out), None, option="--spool-dir ", error=ExportError)


def kind_for(out: Path | str, files: Layout) -> lifecycle.DirKind:
    return export_dir(files, lease=LEASE if on_store(out) else None)


def found(out: Path | str, record: dict, files: Layout) -> lifecycle.Plan:
    """What `out` holds for this export, read without claiming it (the claim decides again): `complete` lets a rerun
    stop before the run's full-read verification."""
    kind = kind_for(out, files)
    if not on_store(out):
        return lifecycle.inspect(Path(out), record, overwrite=False, kind=kind)
    store = store_dir.opened(str(out), None)
    store.check()  # no such bucket, credentials refused, an endpoint that does not answer: one line naming it
    return lifecycle.inspect(out, record, overwrite=False, kind=kind, view=store_dir.StoreView(store, kind))


@dataclass
class ExportOut:
    """An export claimed for this process: `root` is where its files are written (the directory, or the spool)."""

    name: str  # the export as the user named it (a path or the URL): messages and the trainer's arguments
    root: Path
    held: lifecycle.Held | store_dir.StoreHeld
    present: frozenset[str] | None = None  # on a store: the keys there once prepared; None: look at the disk

    @property
    def plan(self) -> lifecycle.Plan:
        return self.held.plan

    @property
    def trainer_name(self) -> str:
        """How a trainer's arguments name the export: its URL on a store (the trainer's wrapper copies it), else the
        directory's absolute path."""
        return self.name.rstrip("/") if self.held.target is not None else str(self.root.resolve())

    def prepare(self) -> None:
        self.held.prepare()
        if self.held.target is not None:
            self.present = frozenset(o.key for o in self.held.target.store().list())

    def has(self, path: Path) -> bool:
        """Whether the file is in place complete (a rerun skips it)."""
        return path.exists() if self.present is None else self._rel(path) in self.present

    def publish(self, *paths: Path) -> None:
        """Files written complete under `root`: on a store uploaded (an earlier attempt's copy replaced) and removed
        from the spool; on disk they are in place already."""
        if self.held.target is not None:
            self.held.target.publish(self.root, [self._rel(p) for p in paths], None)

    def finish(self, sidecar: Mapping[str, Any]) -> None:
        """export.json written last, only while this export still holds `out`; the plan removed."""
        held = self.held
        if held.target is None:
            held.finish(lambda: finish(self.root, sidecar))
            return
        held.finish(lambda: held.complete(json_text(sidecar).encode()))  # type: ignore[union-attr]
        held.target.store().delete(PLAN)

    def _rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()


@contextmanager
def claimed(out: Path | str, record: dict, files: Layout, *, spool_root: str) -> Iterator[ExportOut]:
    """`out` for this export alone, what it holds decided (a rerun of a finished export: `complete`)."""
    kind = kind_for(out, files)
    if on_store(out):
        with store_dir.held(str(out), record, kind=kind, spool_root=spool_root, wait=False, overwrite=False) as held:
            yield ExportOut(name=str(out), root=held.out, held=held)
    else:
        with lifecycle.held(Path(out), record, kind=kind, wait=False, overwrite=False) as local:
            yield ExportOut(name=str(out), root=Path(out), held=local)


def export_copy(url: str, spool_root: str = store_dir.DEFAULT_SPOOL) -> Path:
    """A finished export on a store copied into the spool, for a trainer that reads local files (the objects of its
    layout but its lease; reused while they are unchanged); StorageError naming the URL when it holds no finished
    export."""
    store = store_dir.opened(url, None)
    store.check()
    listing = {o.key: o for o in store.list()}
    if SIDECAR not in listing:
        raise StorageError(f"{url} holds no finished export (no {SIDECAR})" + (
            ": rerun the pipeline.export command that wrote it to finish it" if PLAN in listing else ""))
    sidecar = store_dir.record_at(store, SIDECAR, StorageError)
    fmt = sidecar.get("format") if isinstance(sidecar, dict) else None
    if fmt not in FORMATS:
        raise StorageError(f"{url}/{SIDECAR} names no export format this code reads ({fmt!r})")
    written = sidecar.get("draft_vocab")  # type: ignore[union-attr]
    files = export_files(FORMATS[fmt].files, states=sidecar.get("states", "copy"),  # type: ignore[union-attr]
                         draft_vocab=written.get("draft_vocab_size") if isinstance(written, dict) else None)
    keys = export_layout(files, LEASE).read_keys(listing)
    return copied(store, url, url.rstrip("/").rsplit("/", 1)[-1], {k: listing[k] for k in keys}, spool_root,
                  prefix=True)
