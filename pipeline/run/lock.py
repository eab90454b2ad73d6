"""One writer per run directory: an exclusive lock on `<out_dir>/.lock`, held from the out_dir check to the manifest.

Two layers, because a run directory may live on storage shared by several hosts (a Ray cluster's volume):
- an OS lock (`flock`) on the lock file: on one host (and on file systems that pass flock through, such as NFSv4),
  a second process cannot take it while the first lives, and the kernel releases it when the holder dies, kill -9
  included, so a crash never leaves a stale lock;
- a lease in the same file: the holder's pid, host, a random token and a heartbeat renewed every
  `HEARTBEAT_SECONDS`. A process whose flock succeeded still refuses a lease held by another host with a fresh
  heartbeat (the file system may not share flocks between hosts), and takes over one whose heartbeat is older than
  `STALE_SECONDS`. Every shard writer (a Ray actor on any host) checks that the lease still carries its run's token
  before it finishes a shard (`check_lease`), so a run that lost its directory to another never finishes a shard in it.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import secrets
import socket
import threading
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from pipeline.core.io import FILE_MODE
from pipeline.shards.layout import LOCK_NAME

log = logging.getLogger(__name__)
HEARTBEAT_SECONDS = 10.0
STALE_SECONDS = 60.0  # a lease not renewed for this long belongs to a dead or cut-off holder


class OutDirBusy(RuntimeError):
    """Another run holds the run directory."""


class LockLost(RuntimeError):
    """The run directory's lease no longer carries this run's token: another run took it over."""


@dataclass(frozen=True, kw_only=True)
class Lease:
    pid: int
    host: str
    token: str
    started_utc: str
    heartbeat: float  # time.time() of the last renewal
    released: bool = False

    def describe(self) -> str:
        age = time.time() - self.heartbeat
        return f"pid {self.pid} on host {self.host} (since {self.started_utc}, heartbeat {age:.0f}s ago)"

    @property
    def fresh(self) -> bool:
        return not self.released and time.time() - self.heartbeat < STALE_SECONDS


def read_lease(out_dir: Path) -> Lease | None:
    """The lease in `out_dir`, or None when there is none (or it cannot be read: a torn or foreign file)."""
    for _ in range(3):  # a renewal may be in the middle of rewriting it
        try:
            raw = json.loads((Path(out_dir) / LOCK_NAME).read_text(encoding="utf-8") or "null")
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            time.sleep(0.02)
            continue
        try:
            return Lease(**raw) if isinstance(raw, dict) else None
        except TypeError:
            return None
    return None


def check_lease(out_dir: Path, token: str | None) -> None:
    """Raise LockLost unless the lease of `out_dir` carries `token` (None: no lock is in use, nothing to check)."""
    if token is None:
        return
    lease = read_lease(out_dir)
    if lease is None or lease.token != token or lease.released:
        holder = lease.describe() if lease is not None else "nobody"
        raise LockLost(f"out_dir={str(out_dir)!r} is no longer this run's (its lock is held by {holder}); "
                       f"stopped before finishing another shard")


class OutDirLock:
    """`with OutDirLock(out_dir, wait=False) as lock:` creates out_dir, takes it, and gives it back on exit."""

    def __init__(self, out_dir: Path, *, wait: bool = False) -> None:
        self.out_dir, self.path, self.wait = Path(out_dir), Path(out_dir) / LOCK_NAME, wait
        self.token = secrets.token_hex(8)
        self._fd: int | None = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self._lease: Lease | None = None

    def __enter__(self) -> "OutDirLock":
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, FILE_MODE)
        try:
            self._take()
        except BaseException:
            os.close(self._fd)
            self._fd = None
            raise
        self._lease = Lease(pid=os.getpid(), host=socket.gethostname(), token=self.token, heartbeat=time.time(),
                            started_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"))
        self._write(self._lease)
        self._beat = threading.Thread(target=self._renew, name="out-dir-lease", daemon=True)
        self._beat.start()
        return self

    def _take(self) -> None:
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._busy(read_lease(self.out_dir))
                fcntl.flock(self._fd, fcntl.LOCK_EX)  # wait=True: until the holder ends
            lease = read_lease(self.out_dir)
            if lease is None or not lease.fresh or lease.host == socket.gethostname():
                if lease is not None and not lease.released:
                    log.warning("out_dir=%s: taking over the lock of %s, which is gone", self.out_dir,
                                lease.describe())
                return
            # Our flock succeeded, yet another host renews the lease: the file system does not share flocks.
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            self._busy(lease)
            time.sleep(min(HEARTBEAT_SECONDS, STALE_SECONDS / 4))

    def _busy(self, lease: Lease | None) -> None:
        holder = lease.describe() if lease is not None else "another process"
        if not self.wait:
            raise OutDirBusy(f"out_dir={str(self.out_dir)!r} is in use by {holder}: another extract is writing it. "
                             f"Wait for it to finish, or pass wait_for_lock=true to wait here")
        log.warning("out_dir=%s is in use by %s; waiting for it (wait_for_lock=true)", self.out_dir, holder)

    def _write(self, lease: Lease) -> None:
        data = json.dumps(asdict(lease), sort_keys=True).encode()
        os.pwrite(self._fd, data, 0)
        os.ftruncate(self._fd, len(data))
        os.fsync(self._fd)

    def _renew(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            current = read_lease(self.out_dir)
            if current is not None and current.token != self.token:  # taken over: never write over the new holder
                log.error("out_dir=%s was taken over by %s; this run stops before its next shard", self.out_dir,
                          current.describe())
                return
            try:
                self._lease = Lease(**{**asdict(self._lease), "heartbeat": time.time()})
                self._write(self._lease)
            except OSError as e:  # a full or failing disk: the writers' own errors will say more
                log.warning("out_dir=%s: could not renew the lock's lease: %s", self.out_dir, e)

    def check(self) -> None:
        """Raise LockLost unless this run still holds the directory (before the manifest makes it finished)."""
        check_lease(self.out_dir, self.token)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        if self._fd is None:
            return
        try:
            if self._lease is not None and read_lease(self.out_dir) == self._lease:
                self._write(Lease(**{**asdict(self._lease), "released": True}))
        except OSError:
            pass  # the OS lock still goes with the descriptor
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
