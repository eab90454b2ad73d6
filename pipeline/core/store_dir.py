"""An output directory on a store (`s3://bucket/prefix`), written through a local spool: the lifecycle of
pipeline.core.lifecycle with the store's conditional writes where a disk has locks and renames.

- one writer: the lease is an object at the kind's lock key (`pipeline.core.storeclaim.StoreClaim`), and every writer,
  on any host, checks it carries the job's token before it finishes a unit (`StoreTarget.check_lease`);
- what the prefix holds is decided from one listing by the rules a directory is decided by (`lifecycle.inspect` on a
  `StoreView`): new, resume (the same start record), replace (only with overwrite), or refused naming why;
- a unit is written into the spool as on a disk, then published (`StoreTarget.publish`): its marker object removed,
  its files uploaded create-only (multipart parts verified by CRC32 and MD5; an earlier attempt's leftover replaced),
  the lease checked, then its marker, the spool's own bytes. The spool's copies are removed then, so the spool holds
  only the units in flight, whatever the run's size;
- a unit is done when its marker object reads back and every file it lists is there with its recorded size (the upload
  verified the bytes; `pipeline.verify` reads them all);
- the completing file is written last and create-only, after the lease is checked: nothing looks finished before every
  unit is. Multipart uploads a killed writer left are aborted when the next job prepares the prefix.
"""
from __future__ import annotations

import functools
import hashlib
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ContextManager, Iterator, Sequence

from pipeline.core import jsonfile
from pipeline.core.lifecycle import DirKind, Held, Plan, inspect, keeps_all, refusals
from pipeline.core.lifecycle import held as lifecycle_held
from pipeline.core.claim import ClaimLost
from pipeline.core.cli import ConfigError
from pipeline.core.outdir import json_text, unusable_dir
from pipeline.core.storage import SCHEME, Exists, Store
from pipeline.core.storeclaim import StoreClaim, check_store_lease
from pipeline.core.stores import open_store

MAX_RECORD_BYTES = 16 << 20  # a start record or a marker read back from the store
DEFAULT_SPOOL = "~/.cache/pipeline/spool"  # where a job stages what it writes to or reads from a store (spool_dir)


@functools.lru_cache(maxsize=8)
def opened(url: str, endpoint: str | None) -> Store:
    """One store per location and process (a Ray actor opens its own: clients do not travel)."""
    return open_store(url, endpoint=endpoint)


def spool_for(root: str | Path, store: Store) -> Path:
    """The local directory a job writing to `store` stages its units in: one per location (endpoint and URL), under
    `root`."""
    where = f"{getattr(store, 'endpoint_url', None)} {store.url}"
    return Path(root).expanduser() / hashlib.sha256(where.encode()).hexdigest()[:16]


def checked_spool(spool_root: str, url: str, endpoint: str | None, *, option: str = "spool_dir=",
                  error: type[Exception] = ConfigError) -> Path:
    """The local folder a job writing to `url` stages its units in (an unsupported URL refused, naming it); `error`
    naming `option` when it cannot be written."""
    spool = spool_for(spool_root, opened(url, endpoint))
    if (why := unusable_dir(spool)) is not None:
        raise error(f"{option}{spool_root!r} (the local folder files are written in before they are uploaded to "
                    f"{url}) {why}")
    return spool


def check_early(url: str, *, kind: DirKind, overwrite: bool, endpoint: str | None) -> None:
    """What can be refused before a model is hashed or an engine starts: a location that cannot be used (no such
    bucket, credentials refused, an endpoint that does not answer) and, without overwrite, a finished directory of
    the kind. `held` decides the rest, under the lease."""
    store = opened(url, endpoint)
    store.check()
    done = kind.layout.done
    if overwrite or done is None or store.head(done) is None:
        return
    try:
        finished = isinstance(record_at(store, done, ValueError), dict)
    except (ValueError, FileNotFoundError):
        return  # a torn completing file: not finished (held says what it holds)
    if finished and kind.finished_record is None:
        raise kind.error(f"{kind.name(url)} holds a finished {kind.noun} ({done}); {kind.hint('replace it')}")


def record_at(store: Store, key: str, error: type[Exception]) -> object:
    """The JSON record `key` of `store` (`error` naming its URL when it is not one, or too large)."""
    where = f"{store.url}/{key}"
    data = store.get(key, 0, MAX_RECORD_BYTES + 1)
    return jsonfile.parse(data, error, where=where, max_bytes=MAX_RECORD_BYTES)


class StoreView:
    """What `lifecycle.inspect` reads of a store's prefix: one listing, the start record and the completing file."""

    def __init__(self, store: Store, kind: DirKind) -> None:
        self.store, self.kind = store, kind
        self.keys = {o.key for o in store.list()}

    def exists(self) -> bool:
        return bool(self.keys)

    def foreign(self) -> list[str]:
        return self.kind.layout.foreign_keys(self.keys)

    def is_finished(self) -> bool:
        done = self.kind.layout.done
        if done is None or done not in self.keys:
            return False
        try:
            return isinstance(record_at(self.store, done, ValueError), dict)
        except (ValueError, FileNotFoundError):
            return False

    def has_start(self) -> bool:
        return self.kind.layout.start in self.keys

    def read_start(self) -> dict:
        return self._object(str(self.kind.layout.start))

    def finished_record(self) -> dict | None:
        done = str(self.kind.layout.done)
        return self.kind.finished_record(self._object(done), f"{self.store.url}/{done}")  # type: ignore[misc]

    def _object(self, key: str) -> dict:
        value = record_at(self.store, key, self.kind.error)
        if not isinstance(value, dict):
            raise self.kind.error(f"{self.store.url}/{key} holds no JSON object")
        return value


@dataclass(frozen=True)
class StoreTarget:
    """Where a job's units go when its directory is on a store; small and picklable (it travels to Ray actors,
    which open their own client): the location, the lease's key and this job's token."""

    url: str
    endpoint: str | None
    lock: str
    token: str
    spool_root: str  # as the user gave it (`~` unexpanded): each node has its own spool under it

    def spool(self) -> Path:
        """This node's spool for the job (a Ray actor's is on its own node's disk)."""
        return spool_for(self.spool_root, self.store())

    def store(self) -> Store:
        return opened(self.url, self.endpoint)

    def check_lease(self, then: str = "stopped before finishing another unit") -> None:
        check_store_lease(self.store(), self.lock, self.token, what=self.url, then=then)

    def finished(self, marker: str) -> dict | None:
        """The unit's marker when the unit is done on the store, else None (redo it): the marker reads back as an
        object, and every file it lists is there with its recorded size."""
        store = self.store()
        try:
            record = record_at(store, marker, ValueError)
        except (ValueError, FileNotFoundError):
            return None
        files = record.get("files") if isinstance(record, dict) else None
        if not isinstance(files, dict):
            return None
        for rel, info in files.items():
            try:
                found = store.head(rel)
            except ValueError:  # a listed name that is no key under the prefix (`..`, absolute): a foreign marker
                return None
            if found is None or not isinstance(info, dict) or found.size != info.get("bytes"):
                return None
        return record

    def fetch(self, key: str, path: Path) -> bool:
        """A small object of the store copied to `path` (a unit's rejects, read back on a resume); False: none."""
        try:
            data = self.store().get(key)
        except FileNotFoundError:
            return False
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return True

    def publish(self, spool: Path, files: Sequence[str], marker: str | None, *, gone: Sequence[str] = ()) -> None:
        """Publish one unit written in `spool`: its marker object removed (from here on the unit is unfinished),
        `gone` (what an earlier attempt wrote that this one did not) removed, its files uploaded (an earlier
        attempt's copy replaced), the lease checked, then its marker; the spool's copies removed."""
        store = self.store()
        self.check_lease()  # before anything of the unit is removed: a writer that lost the run touches nothing
        for key in ([marker] if marker else []) + list(gone):
            store.delete(key)
        for rel in files:
            try:
                store.upload(rel, spool / rel)
            except Exists:  # an earlier attempt's, killed before its marker: not necessarily these bytes
                store.delete(rel)
                store.upload(rel, spool / rel)
        if marker is not None:
            self.check_lease()
            store.upload(marker, spool / marker)
        for rel in list(files) + ([marker] if marker else []):
            (spool / rel).unlink(missing_ok=True)

    def put_file(self, spool: Path, rel: str) -> None:
        """A small file of the job's own (a report, the prepare step's rejects) put in place over any earlier one."""
        self.store().put(rel, (spool / rel).read_bytes())


@dataclass
class StoreHeld:
    """A store's prefix claimed for one job (`held`): what `inspect` decided, the spool the job writes in (`out`),
    the target its writers publish to, `prepare` once the job may write and `finish` that writes the completing
    file only while the lease is still this job's."""

    url: str
    out: Path  # the spool
    record: dict
    plan: Plan
    kind: DirKind
    target: StoreTarget

    @property
    def token(self) -> str:
        return self.target.token

    def prepare(self) -> None:
        """The prefix made ready as `inspect` decided: uploads a killed writer left aborted; for a new job the
        completing file removed first (a replacement cut short never looks finished), then the kind's other objects
        but those it keeps, and the start record written."""
        store, layout = self.target.store(), self.kind.layout
        store.abort_unfinished()
        if keeps_all(self.plan, self.kind):
            if self.plan == "resume" and layout.done is not None and store.head(layout.done) is not None:
                store.delete(layout.done)  # unreadable: inspect found no finish
            return
        if layout.done is not None:
            store.delete(layout.done)
        for info in store.list():
            top = info.key.split("/", 1)[0]
            if layout.owns(top) and top not in self.kind.kept:
                store.delete(info.key)
        if layout.start is not None:
            store.put(layout.start, json_text(self.record).encode())

    def finish(self, write: Callable[[], None]) -> None:
        self.target.check_lease(then=f"stopped before finishing the {self.kind.noun}")
        write()

    def complete(self, data: bytes) -> None:
        """The completing file written create-only (after `finish` checked the lease), then the spool removed:
        ClaimLost when another job wrote it meanwhile (that directory is left as it is)."""
        try:
            self.target.store().put(str(self.kind.layout.done), data, create=True)
        except Exists:
            raise self.taken() from None
        shutil.rmtree(self.out, ignore_errors=True)

    def taken(self) -> ClaimLost:
        return ClaimLost(f"{self.url}/{self.kind.layout.done} was written by another job meanwhile; this one stops "
                         f"without touching that {self.kind.noun}")


@contextmanager
def held(url: str, record: dict, *, kind: DirKind, spool_root: str, wait: bool, overwrite: bool,
         endpoint: str | None = None) -> Iterator[StoreHeld]:
    """`lifecycle.held` for a store's prefix: the lease taken, what the prefix holds decided (refused here, before any
    engine starts), the spool emptied of an earlier job's leftovers; the job then prepares, writes and finishes."""
    store = opened(url, endpoint)
    store.check()  # a bucket that does not exist, credentials refused, an endpoint that does not answer: exit 2
    refusal, waiting = refusals(url, kind)
    with StoreClaim(store, str(kind.layout.lock), wait=wait, refusal=refusal, waiting=waiting) as claim:
        plan = inspect(url, record, overwrite=overwrite, kind=kind, view=StoreView(store, kind))
        target = StoreTarget(url=url, endpoint=store.endpoint_url, lock=str(kind.layout.lock), token=claim.token,
                             spool_root=spool_root)
        spool = spool_for(spool_root, store)
        shutil.rmtree(spool, ignore_errors=True)
        spool.mkdir(parents=True)
        try:
            yield StoreHeld(url=url, out=spool, record=record, plan=plan, kind=kind, target=target)
        finally:  # units in flight are redone by a rerun; what the job wrote for its user to read (a report) is kept
            for child in spool.iterdir() if spool.is_dir() else ():
                if child.is_dir() and child.name not in kind.kept:
                    shutil.rmtree(child, ignore_errors=True)


def held_at(out_dir: str, local: Path, record: dict, *, kind: DirKind, spool_root: str, wait: bool, overwrite: bool,
            endpoint: str | None) -> ContextManager[Held | StoreHeld]:
    """A job's directory claimed: `local` (the checked path) when `out_dir` is on disk, else `out_dir`'s prefix on its
    store through the local spool (`held`); the job's config fields passed as they are."""
    if not SCHEME.match(out_dir):
        return lifecycle_held(local, record, kind=kind, wait=wait, overwrite=overwrite)
    return held(out_dir, record, kind=kind, spool_root=spool_root, wait=wait, overwrite=overwrite, endpoint=endpoint)
