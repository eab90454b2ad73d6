"""One writer per directory: `with DirClaim(root, lock_file=...)` holds `root` for this process until the block ends.

Two layers, because a directory may live on storage shared by several hosts (a Ray cluster's volume):
- an OS lock (`flock`), on a lock file or (`lock_file=None`) on the directory itself, which adds no file a reader
  could list: on one host (and on file systems that pass flock through, such as NFSv4) a second process cannot take
  it while the first lives, and the kernel releases it when the holder dies, kill -9 included, so a crash never
  leaves a stale lock;
- optionally (`lease=True`, in the lock file) a lease: the holder's pid, host, a random token and a heartbeat
  renewed every `HEARTBEAT_SECONDS`. A process whose flock succeeded still refuses a lease held by another host with
  a fresh heartbeat (the file system may not share flocks between hosts), and takes over one whose heartbeat is older
  than `STALE_SECONDS`. Writers on any host call `check_lease(root, token)` before they make a unit of work finished,
  so a process that lost its directory to another never finishes anything in it.
This module knows no kind of directory: the caller's `refusal` words the error a busy directory gets.
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
from typing import Callable

from pipeline.core.cli import RunFailed, UsageError
from pipeline.core import jsonfile
from pipeline.core.io import FILE_MODE

log = logging.getLogger(__name__)
HEARTBEAT_SECONDS = 10.0
STALE_SECONDS = 60.0  # a lease not renewed for this long belongs to a dead or cut-off holder


class DirBusy(UsageError):
    """Another process holds the directory: nothing was touched, and the same command waits or fails again."""


class ClaimLost(RunFailed):
    """The directory's lease no longer carries this process's token: another process took it over."""


@dataclass(frozen=True, kw_only=True)
class Lease:
    pid: int
    host: str
    token: str
    started_utc: str
    heartbeat: float  # time.time() of the last renewal
    released: bool = False
    # The machine's boot and the holder's pid namespace (pipeline.core.storeclaim): "" where not recorded. Two
    # containers with one hostname (host networking) do not share it, so neither reads the other's pid as its own.
    pid_space: str = ""

    def holder(self) -> str:
        age = time.time() - self.heartbeat
        return f"pid {self.pid} on host {self.host} (since {self.started_utc}, heartbeat {age:.0f}s ago)"

    @property
    def fresh(self) -> bool:
        return not self.released and time.time() - self.heartbeat < STALE_SECONDS


_LEASE_TYPES = {"pid": int, "host": str, "token": str, "started_utc": str, "heartbeat": (int, float), "released": bool,
                "pid_space": str}


def well_typed(lease: Lease) -> bool:
    """Every field of the type a lease's writer gives it (a foreign or edited file is no lease)."""
    return all(isinstance(getattr(lease, name), kind) for name, kind in _LEASE_TYPES.items())


def read_lease(lock_path: Path) -> Lease | None:
    """The lease in `lock_path`, or None when there is none (or it cannot be read: a torn or foreign file)."""
    for _ in range(3):  # a renewal may be in the middle of rewriting it
        try:
            raw = jsonfile.parse(Path(lock_path).read_bytes() or b"null", where=str(lock_path))  # bounded
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            time.sleep(0.02)
            continue
        try:
            lease = Lease(**raw) if isinstance(raw, dict) else None
        except TypeError:
            return None
        return lease if lease is not None and well_typed(lease) else None
    return None


def check_lease(lock_path: Path, token: str | None, *, what: str, then: str) -> None:
    """Raise ClaimLost unless the lease in `lock_path` carries `token` (None: no lease is in use, nothing to check);
    `what` names the directory in the message, `then` what the caller does instead."""
    if token is None:
        return
    lease = read_lease(lock_path)
    if lease is None or lease.token != token or lease.released:
        holder = lease.holder() if lease is not None else "nobody"
        raise ClaimLost(f"{what} is no longer this run's (its lock is held by {holder}); {then}")


def flock_holder(path: Path) -> str | None:
    """Who holds the flock on `path` when no lease names it (a directory locked on itself): the kernel's own table,
    /proc/locks, read bounded; None where it cannot tell (not Linux, a lock held on another host)."""
    try:
        st = os.stat(path)
        with open("/proc/locks", "rb") as f:
            table = f.read(1 << 20).decode("ascii", "replace")
    except OSError:
        return None
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in table.splitlines():
        fields = line.split()
        if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == where and fields[4].isdigit() \
                and int(fields[4]) not in (0, os.getpid()):
            return f"pid {fields[4]} on host {socket.gethostname()}"
    return None


def _default_refusal(root: Path) -> Callable[[str], str]:
    return lambda holder: f"{root} is in use by {holder}"


class DirClaim:
    """`with DirClaim(root, lock_file=".lock", lease=True) as claim:` creates `root`, takes it, gives it back on exit.

    wait: wait for the holder to end instead of raising busy_error(refusal(holder)) (the caller's own error class,
    DirBusy by default); `waiting(holder)` is logged then.
    """

    def __init__(self, root: Path, *, lock_file: str | None, lease: bool = False, wait: bool = False,
                 refusal: Callable[[str], str] | None = None, waiting: Callable[[str], str] | None = None,
                 busy_error: type[Exception] = DirBusy) -> None:
        if lease and lock_file is None:
            raise ValueError("a lease lives in a lock file: lease=True needs lock_file")
        self.root = Path(root)
        self.path = self.root / lock_file if lock_file is not None else self.root
        self.lease, self.wait, self.busy_error = lease, wait, busy_error
        self.refusal = refusal or _default_refusal(self.root)
        self.waiting = waiting or (lambda holder: f"{self.root} is in use by {holder}; waiting for it")
        self.token = secrets.token_hex(8) if lease else None
        self._fd: int | None = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self._lease: Lease | None = None

    def __enter__(self) -> "DirClaim":
        self.root.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY) if self.path == self.root else \
            os.open(self.path, os.O_RDWR | os.O_CREAT, FILE_MODE)
        try:
            self._take()
        except BaseException:
            os.close(self._fd)
            self._fd = None
            raise
        if self.lease:
            self._lease = Lease(pid=os.getpid(), host=socket.gethostname(), token=self.token, heartbeat=time.time(),
                                started_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"))
            self._write(self._lease)
            self._beat = threading.Thread(target=self._renew, name="dir-claim-lease", daemon=True)
            self._beat.start()
        return self

    def _current(self) -> Lease | None:
        """The lease in the lock file (another holder's may be there even when this claim keeps none)."""
        return read_lease(self.path) if self.path != self.root else None

    def _take(self) -> None:
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._busy(self._current())
                fcntl.flock(self._fd, fcntl.LOCK_EX)  # wait=True: until the holder ends
            lease = self._current()
            if lease is None or not lease.fresh or lease.host == socket.gethostname():
                if lease is not None and not lease.released:
                    log.warning("%s: taking over the lock of %s, which is gone", self.root, lease.holder())
                return
            # Our flock succeeded, yet another host renews the lease: the file system does not share flocks.
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            self._busy(lease)
            time.sleep(min(HEARTBEAT_SECONDS, STALE_SECONDS / 4))

    def _busy(self, lease: Lease | None) -> None:
        holder = lease.holder() if lease is not None else flock_holder(self.path) or "another process"
        if not self.wait:
            raise self.busy_error(self.refusal(holder))
        log.warning("%s", self.waiting(holder))

    def _write(self, lease: Lease) -> None:
        data = json.dumps(asdict(lease), sort_keys=True).encode()
        os.pwrite(self._fd, data, 0)
        os.ftruncate(self._fd, len(data))
        os.fsync(self._fd)

    def _renew(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            current = read_lease(self.path)
            if current is not None and current.token != self.token:  # taken over: never write over the new holder
                log.error("%s was taken over by %s; this process stops before its next unit", self.root,
                          current.holder())
                return
            try:
                self._lease = Lease(**{**asdict(self._lease), "heartbeat": time.time()})
                self._write(self._lease)
            except OSError as e:  # a full or failing disk: the writers' own errors will say more
                log.warning("%s: could not renew the lock's lease: %s", self.root, e)


    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        if self._fd is None:
            return
        try:
            if self._lease is not None and read_lease(self.path) == self._lease:
                self._write(Lease(**{**asdict(self._lease), "released": True}))
        except OSError:
            pass  # the OS lock still goes with the descriptor
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
