"""A directory a process fills for the user: what it owns, how it starts, resumes, marks units done and cleans up.

A `Layout` names, once, every entry a kind of directory writes at its root (files, and folders with the patterns of
what they hold), its lock file, its start record and the file written last that makes it complete. The kinds (a run,
an export, a built model) declare theirs beside the code that writes them; this module knows none of them.

Write protocol every kind follows (each file through `pipeline.core.io.atomic_path`, so its fault points apply):
claim the directory (`pipeline.core.claim.DirClaim`), compare the start record with this process's (resume only the
same work), remove stale temp files, write units each followed by its completion marker (`write_marker`; a unit is
done when its marker reads back and the files it lists have their recorded sizes: `read_marker`, `files_intact`),
and the completing file last.
"""
from __future__ import annotations

import glob
import json
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from pipeline.core import jsonfile
from pipeline.core.faults import fault_point
from pipeline.core.io import sha256_file, write_text_atomic

TEMP_SUFFIX = ".tmp"


def is_temp_of(name: str, final: str) -> bool:
    """True for the temp file of an atomic write of `final` (pipeline.core.io.atomic_path: `.<final>.<random>.tmp`)."""
    return name.startswith(f".{final}.") and name.endswith(TEMP_SUFFIX)


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One entry of a directory as its kind sees it (`Layout.walk`)."""

    rel: str  # relative to the directory: `manifest.json`, `shards/shard-00000.safetensors`
    path: Path
    folder: str | None  # the kind's folder it lies in; None at the root
    what: str  # file | folder (the kind's own) | temp (an atomic write's) | symlink | special | unknown
    is_dir: bool


def _entries(folder: Path) -> list[Path]:
    return sorted(Path(folder).iterdir(), key=lambda p: p.name)


@dataclass(frozen=True, kw_only=True)
class Layout:
    """Every name a kind of directory owns at its root.

    files: root files it writes; dirs: root folders -> regular expressions of the entry names they hold (empty: any);
    lock: its lock file (None: the directory itself is locked, or it has no lock); start: the start record a resume
    compares; done: the file written last (the directory is complete once it exists).
    """

    kind: str
    files: tuple[str, ...] = ()
    dirs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    lock: str | None = None
    start: str | None = None
    done: str | None = None

    @property
    def names(self) -> tuple[str, ...]:
        extra = tuple(n for n in (self.lock, self.start, self.done) if n is not None and n not in self.files)
        return self.files + extra + tuple(self.dirs)

    def owns(self, name: str) -> bool:
        """A root name this kind writes, or the temp file of one."""
        return name in self.names or any(is_temp_of(name, n) for n in self.names)

    def holds(self, folder: str, name: str) -> bool:
        """Whether `name` is an entry `folder` (one of `dirs`) may hold."""
        patterns = self.dirs[folder]
        return not patterns or any(re.fullmatch(p, name) for p in patterns)

    def walk(self, root: Path) -> list[Entry]:
        """Every entry of `root` and of the folders it owns, sorted, each as this kind sees it: the one walk a
        replacement (`foreign`), a resume (`stale_temps`), verify and the attestation read."""
        root = Path(root)
        found = []
        for child in _entries(root):
            entry = self._entry(child, child.name, folder=None)
            found.append(entry)
            if entry.what == "folder":
                found += self._folder(child)
        return found

    def _folder(self, folder: Path) -> list[Entry]:
        """A folder's entries; below a folder inside it (never the kind's, named once) only the temp files a killed
        writer left, at any depth."""
        found = []
        for child in _entries(folder):
            found.append(self._entry(child, f"{folder.name}/{child.name}", folder=folder.name))
            if found[-1].is_dir:
                found += [Entry(rel=t.relative_to(folder.parent).as_posix(), path=t, folder=folder.name, what="temp",
                                is_dir=False) for t in sorted(child.rglob(f".*{TEMP_SUFFIX}"))
                          if t.is_file() and not t.is_symlink()]
        return found

    def _entry(self, path: Path, rel: str, *, folder: str | None) -> Entry:
        """What `path` is: a symlink, a special file or a temp file whatever its name, else owned or unknown."""
        name, is_dir = path.name, path.is_dir() and not path.is_symlink()
        plain = path.is_file() and not path.is_symlink()
        temp = plain and (any(is_temp_of(name, n) for n in self.names) if folder is None else
                          name.startswith(".") and name.endswith(TEMP_SUFFIX))
        if path.is_symlink():
            what = "symlink"
        elif temp:
            what = "temp"
        elif not is_dir and not plain:
            what = "special"
        elif folder is None:
            what = ("folder" if name in self.dirs else "unknown") if is_dir else \
                ("file" if name in self.names and name not in self.dirs else "unknown")
        else:
            what = "file" if plain and self.holds(folder, name) else "unknown"
        return Entry(rel=rel, path=path, folder=folder, what=what, is_dir=is_dir)

    def foreign(self, root: Path) -> list[str]:
        """Every entry of `root` this kind does not write, sorted, nested ones included (`shards/notes.txt`,
        `records/sub/`): a name it does not own, a symlink or special file whatever its name, a folder inside one
        of its folders. A replacement removes owned folders whole, so what they hold must be the kind's own."""
        return [e.rel + ("/" if e.is_dir else "") for e in self.walk(root) if e.what in ("unknown", "symlink",
                                                                                         "special")]

    def foreign_keys(self, keys: Iterable[str]) -> list[str]:
        """`foreign` for the keys of a store's prefix (relative to it; a store holds no folder, link or temp file):
        every key that is neither a root file this kind writes nor an entry one of its folders may hold."""
        def own(key: str) -> bool:
            folder, _, name = key.partition("/")
            if not name:
                return key in self.names and key not in self.dirs
            return folder in self.dirs and "/" not in name and self.holds(folder, name)
        return sorted(key for key in keys if not own(key))

    def read_keys(self, keys: Iterable[str]) -> list[str]:
        """The keys of a finished prefix of this kind that a reader copies: its own, less its lock (a user's object
        and the writer's lease are never a reader's)."""
        keys = list(keys)
        foreign = set(self.foreign_keys(keys))
        return sorted(key for key in keys if key not in foreign and key != self.lock)

    def is_done(self, root: Path) -> bool:
        return self.done is not None and (Path(root) / self.done).is_file()

    def stale_temps(self, root: Path) -> Iterator[Path]:
        """Temp files killed writers left: those of the root names, and any inside the owned folders."""
        yield from (e.path for e in self.walk(root) if e.what == "temp")

    def remove_stale_temps(self, root: Path) -> None:
        for stale in list(self.stale_temps(root)):
            remove(stale)


def unusable_dir(path: Path) -> str | None:
    """Why `path` cannot be (or become) a directory this process writes, in words that follow its name ("exists and
    is not a directory", "cannot be created: P is a file", "is not writable (P: Permission denied)"), or None. A real
    write proves it: permission bits alone say nothing for root or on a read-only mount."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        return "exists and is not a directory"
    probe = path if path.exists() else next(p for p in path.absolute().parents if p.exists())
    if not probe.is_dir():
        return f"cannot be created: {probe} is a file"
    try:
        tempfile.TemporaryFile(dir=probe).close()
    except OSError as e:
        return f"is not writable ({probe}: {e.strerror})"
    return None


def remove_temps_of(finals: Iterable[Path]) -> None:
    """The temp files of these files only (a unit's writer clears its own; other writers may be busy beside it)."""
    for final in map(Path, finals):
        for stale in final.parent.glob(f".{glob.escape(final.name)}.*{TEMP_SUFFIX}"):
            stale.unlink(missing_ok=True)


def remove(path: Path) -> None:
    """Remove a file or a folder (not following a symlink), through the `remove` fault point."""
    path = Path(path)
    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)
    fault_point("remove", path.name)


def json_text(record: Mapping[str, Any]) -> str:
    """A start record, marker or completing file's text: sorted, indented JSON (the same bytes on any store)."""
    return json.dumps(record, indent=2, sort_keys=True, default=str) + "\n"


def write_json(path: Path, record: Mapping[str, Any]) -> None:
    """A start record, marker or completing file, written atomically."""
    write_text_atomic(path, json_text(record))


def read_record(path: Path) -> dict | None:
    """The JSON object in `path`; None when there is none, or it is torn or not an object (a crash's leftover)."""
    return jsonfile.read_lenient(Path(path))  # bounded in size and nesting: a foreign file is no record either


def file_records(root: Path, paths: Iterable[Path]) -> dict[str, dict[str, Any]]:
    """{path relative to root: {"sha256", "bytes"}} of finished files, as markers list them."""
    root = Path(root)
    return {Path(p).relative_to(root).as_posix(): {"sha256": sha256_file(p), "bytes": Path(p).stat().st_size}
            for p in paths}


def files_intact(root: Path, files: Mapping[str, Mapping[str, Any]]) -> bool:
    """Every listed file (relative to root) present with its recorded size: the cheap check a resume trusts."""
    if not isinstance(files, Mapping):
        return False
    for rel, info in files.items():
        path = Path(root) / rel
        if not path.is_file() or not isinstance(info, Mapping) or path.stat().st_size != info.get("bytes"):
            return False
    return True


def unit_done(root: Path, marker: Path, *, sha256: bool = True) -> dict | None:
    """A unit's marker when the unit is done, else None (redo it): the marker reads back, and every file it lists
    (relative to root) is in place with its recorded size and, with `sha256`, its recorded digest: what a resume
    keeps of an earlier invocation's work, for every kind of directory."""
    record = read_marker(marker)
    if record is None or not files_intact(root, record.get("files")):
        return None
    if sha256 and any(sha256_file(Path(root) / rel) != info.get("sha256") for rel, info in record["files"].items()):
        return None
    return record


def write_marker(path: Path, record: Mapping[str, Any]) -> None:
    """Mark a unit done: written after the unit's files are in place, removed before they are rewritten."""
    write_json(path, record)


def clear_marker(path: Path) -> None:
    """From here on the unit counts as unfinished."""
    Path(path).unlink(missing_ok=True)
    fault_point("unlink", Path(path).name)


def read_marker(path: Path) -> dict | None:
    """A unit's marker, or None when it is not done (no marker, or one torn by a crash)."""
    return read_record(path)


def changed(previous: Mapping[str, Any], record: Mapping[str, Any]) -> list[str]:
    """The start record's keys that differ; a changed mapping names its settings (at most 4), e.g.
    `config (runner.storage_dtype: 'float8_e4m3fn' then, None now)`, a short value itself (`format ('speculators'
    then, 'specforge' now)`)."""
    out = []
    for key in sorted(set(previous) | set(record)):
        then, now = previous.get(key), record.get(key)
        if then == now:
            continue
        settings = _settings(then, now, "") if isinstance(then, dict) and isinstance(now, dict) else \
            [(None, then, now)] if len(repr(then)) + len(repr(now)) <= 80 else []  # a short value: shown
        shown = "; ".join(f"{k + ': ' if k else ''}{a!r} then, {b!r} now" for k, a, b in settings[:4])
        out.append(f"{key} ({shown}{'; ...' if len(settings) > 4 else ''})" if shown else key)
    return out


def _settings(then: dict, now: dict, prefix: str) -> list[tuple[str, object, object]]:
    diffs = []
    for key in sorted(set(then) | set(now), key=str):
        a, b = then.get(key), now.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            diffs += _settings(a, b, f"{prefix}{key}.")
        elif a != b:
            diffs.append((f"{prefix}{key}", a, b))
    return diffs
