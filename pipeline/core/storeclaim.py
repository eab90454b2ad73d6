"""One writer per location where no OS lock reaches (object storage): the lease of `pipeline.core.claim`, kept in an
object of the store and changed only by conditional writes.

- take: a create-only write of the lease; when one is there, another holder's lease is refused (or waited for) while
  its heartbeat is fresh by the store's clock (the object's age: no host's clock skew counts), and one released, not
  renewed for `stale_seconds`, or held by a process of this host that is gone (a kill -9) is taken over by a write
  conditional on its version, so of two processes taking it over at once one wins;
- renew: every `heartbeat_seconds`, a write conditional on this holder's last version; one refused means another
  process took it over, and this one stops renewing (its writers' `check` then fails before their next unit);
- release: the lease marked released, conditional on this holder's version.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from pipeline.core.claim import HEARTBEAT_SECONDS, STALE_SECONDS, ClaimLost, DirBusy, Lease, well_typed
from pipeline.core.storage import Exists, ObjectInfo, Stale, Store

log = logging.getLogger(__name__)


def _parse(data: bytes) -> Lease | None:
    try:
        raw = json.loads(data)
        lease = Lease(**raw) if isinstance(raw, dict) else None
    except (ValueError, TypeError):
        return None
    return lease if lease is not None and well_typed(lease) else None


def pid_space() -> str:
    """This machine's boot and this process's pid namespace: pids compare only between processes that share it."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}:{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:  # no /proc (not Linux): no process is ever judged dead from here
        return ""


def _dead_here(lease: Lease | None) -> bool:
    """Whether the lease's holder ran in this pid namespace of this boot and its process is gone (a kill -9 here): its
    lease need not age out. A pid since reused by another process only looks alive: the lease then ages out."""
    if lease is None or not lease.pid_space or lease.pid_space != pid_space():
        return False
    try:
        os.kill(lease.pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, another user's
        return False
    return False


def check_store_lease(store: Store, key: str, token: str, *, what: str, then: str) -> None:
    """ClaimLost unless the lease at `key` still carries `token` (what a writer on any host checks before it
    finishes a unit: it needs only the store, not the claim)."""
    try:
        lease = _parse(store.get(key))
    except FileNotFoundError:
        lease = None
    if lease is None or lease.token != token or lease.released:
        holder = lease.holder() if lease is not None else "nobody"
        raise ClaimLost(f"{what} is no longer this run's (its lease is held by {holder}); {then}")


class StoreClaim:
    """`with StoreClaim(store, key) as claim:` holds the lease at `key` of `store` until the block ends; `claim.check()`
    raises ClaimLost once another process holds it. `refusal`, `waiting` and `busy_error` as DirClaim's."""

    def __init__(self, store: Store, key: str, *, wait: bool = False, refusal: Callable[[str], str] | None = None,
                 waiting: Callable[[str], str] | None = None, busy_error: type[Exception] = DirBusy,
                 heartbeat_seconds: float = HEARTBEAT_SECONDS, stale_seconds: float = STALE_SECONDS) -> None:
        self.store, self.key, self.wait, self.busy_error = store, key, wait, busy_error
        self.where = f"{store.url}/{key}"
        self.refusal = refusal or (lambda holder: f"{store.url} is in use by {holder}")
        self.waiting = waiting or (lambda holder: f"{store.url} is in use by {holder}; waiting for it")
        self.heartbeat_seconds, self.stale_seconds = heartbeat_seconds, stale_seconds
        self.token = secrets.token_hex(8)
        self._lease: Lease | None = None
        self._etag: str | None = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def _current(self) -> tuple[Lease | None, ObjectInfo | None]:
        info = self.store.head(self.key)
        if info is None:
            return None, None
        try:
            return _parse(self.store.get(self.key)), info
        except FileNotFoundError:
            return None, None

    def __enter__(self) -> "StoreClaim":
        self._lease = Lease(pid=os.getpid(), host=socket.gethostname(), token=self.token, heartbeat=time.time(),
                            started_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                            pid_space=pid_space())
        while not self._take():
            time.sleep(min(self.heartbeat_seconds, self.stale_seconds / 4))
        self._beat = threading.Thread(target=self._renew, name="store-claim-lease", daemon=True)
        self._beat.start()
        return self

    def _data(self) -> bytes:
        return json.dumps(asdict(self._lease), sort_keys=True).encode()

    def _take(self) -> bool:
        try:
            self._etag = self.store.put(self.key, self._data(), create=True)
            return True
        except Exists:
            pass
        lease, info = self._current()
        if info is None:
            return False  # released and removed meanwhile: try again
        if (lease is None or not lease.released) and info.age < self.stale_seconds and not _dead_here(lease):
            self._busy(lease, info)  # an object that is no lease this code reads (a newer version's) ages out too
            return False
        try:
            self._etag = self.store.put(self.key, self._data(), match=info.etag)
        except Stale:
            return False  # another process took it over first
        if lease is not None and not lease.released:
            why = "whose process is gone" if info.age < self.stale_seconds else f"not renewed for {info.age:.0f}s"
            log.warning("%s: taking over the lease of %s, %s", self.where, lease.holder(), why)
        return True

    def _busy(self, lease: Lease | None, info: ObjectInfo) -> None:
        holder = f"pid {lease.pid} on host {lease.host} (since {lease.started_utc}, renewed {info.age:.0f}s ago)" \
            if lease is not None else f"a lease this version cannot read (written {info.age:.0f}s ago)"
        if not self.wait:
            raise self.busy_error(self.refusal(holder))
        log.warning("%s", self.waiting(holder))

    def _renew(self) -> None:
        while not self._stop.wait(self.heartbeat_seconds):
            try:
                self._lease = replace(self._lease, heartbeat=time.time())
                self._etag = self.store.put(self.key, self._data(), match=self._etag)
            except Stale:
                if self._adopt():  # an earlier renewal landed though its replies were lost
                    continue
                log.error("%s was taken over; this process stops before its next unit", self.where)
                return
            except Exception as e:  # a store that fails for a while: the writers' own requests will say more
                log.warning("%s: could not renew the lease: %s", self.where, e)

    def _adopt(self) -> bool:
        """The lease's current version, when it still carries this claim's token."""
        lease, info = self._current()
        if lease is None or info is None or lease.token != self.token or lease.released:
            return False
        self._etag = info.etag
        return True

    def check(self, then: str = "stopped before finishing another unit") -> None:
        """ClaimLost unless the lease still carries this claim's token."""
        check_store_lease(self.store, self.key, self.token, what=self.store.url, then=then)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        if self._etag is None:
            return
        try:
            self._lease = replace(self._lease, released=True)
            self.store.put(self.key, self._data(), match=self._etag)
        except Exception as e:  # taken over, or the store fails: the lease ages out and is taken over then
            log.warning("%s: could not release the lease: %s", self.where, e)
        self._etag = None
