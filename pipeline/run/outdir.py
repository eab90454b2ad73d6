"""What the run directory holds, decided under its lock (pipeline.run.lock), and what this run does with it.

- new: nothing of a run, or only what a run that never started leaves (a gate report, rejects of data without one
  valid record, temp files, a replacement cut short): those leftovers are cleared and the run starts;
- resume: an unfinished run of the same record (config, data, model, code): finished shards are kept;
- replace: a finished run, or an unfinished one of another record, with overwrite=true given to this process: the
  run's own files are removed (the manifest first, so a replacement cut short never looks finished), never a file a
  run does not write (those make it refuse, naming them).
Anything else is refused with a ConfigError naming out_dir and why. Nothing here deletes a finished run unless this
process was given overwrite=true.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Literal

from pipeline.config import ConfigError
from pipeline.core.faults import fault_point
from pipeline.core.io import write_text_atomic
from pipeline.shards.layout import (
    DIFF_DIR,
    LOCK_NAME,
    MANIFEST_NAME,
    REJECTS_DIR,
    RUN_FILE,
    RUN_ROOT_NAMES,
    SHARDS_DIR,
    is_temp_of,
    run_owned,
)
from pipeline.shards.manifest import is_finished

Plan = Literal["new", "resume", "replace"]
_KEPT = (LOCK_NAME, DIFF_DIR)  # the lock being held, and this run's own gate report


def _changed(previous: dict, record: dict) -> list[str]:
    """The record's keys that differ; a changed config names its settings (at most 4), e.g.
    `config (runner.storage_dtype: 'float8_e4m3fn' then, None now)`."""
    out = []
    for key in sorted(set(previous) | set(record)):
        then, now = previous.get(key), record.get(key)
        if then == now:
            continue
        settings = _settings(then, now, "") if isinstance(then, dict) and isinstance(now, dict) else []
        shown = "; ".join(f"{k}: {a!r} then, {b!r} now" for k, a, b in settings[:4])
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


def _resume_hint(previous: dict, record: dict) -> str:
    """How to finish the run: with its settings, and with the code it started with when that changed (one run's
    shards all carry one code version)."""
    code = previous.get("code")
    if not isinstance(code, dict) or code == record.get("code") or not code.get("git_commit"):
        return "resume it with the same settings"
    dirty = " plus the uncommitted changes it ran with" if code.get("dirty") else ""
    return f"resume it with the same settings and the code it started with (git commit {code['git_commit']}{dirty})"


def _foreign(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if not run_owned(p.name))


def inspect(out: Path, record: dict, *, overwrite: bool) -> Plan:
    """Read-only: what `prepare` will do with `out`; ConfigError where it must refuse."""
    if not out.exists():
        return "new"
    foreign = _foreign(out)
    marker = out / RUN_FILE
    previous = json.loads(marker.read_text(encoding="utf-8")) if marker.is_file() else None
    finished = is_finished(out)
    if not finished and previous == record:
        return "resume"
    if finished or previous is not None:
        what = "a finished run (manifest.json)" if finished else \
            f"an unfinished run with a different {', '.join(_changed(previous, record))}"
        if not overwrite:
            hint = "choose another out_dir, or pass overwrite=true to replace it" if finished else \
                f"{_resume_hint(previous, record)}, choose another out_dir, or pass overwrite=true to replace it"
            raise ConfigError(f"out_dir={str(out)!r} holds {what}; {hint}")
        if foreign:
            raise ConfigError(f"out_dir={str(out)!r} holds {what} and files a run does not write "
                              f"({', '.join(foreign[:8])}); overwrite=true removes only a run's own files: move "
                              f"those first")
        return "replace"
    if foreign:
        raise ConfigError(f"out_dir={str(out)!r} is not empty and holds no run ({', '.join(foreign[:8])}); choose an "
                          f"empty or new directory")
    return "new"


def _remove(path: Path) -> None:
    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)
    fault_point("remove", path.name)


def _remove_stale_temps(out: Path) -> None:
    """Temp files of writes a killed run left (pipeline.core.io.atomic_path names them `.<name>.<random>.tmp`)."""
    for child in out.iterdir():
        if any(is_temp_of(child.name, name) for name in RUN_ROOT_NAMES):
            _remove(child)
    for sub in (REJECTS_DIR, SHARDS_DIR):
        for stale in (out / sub).glob(".*.tmp"):
            _remove(stale)


def prepare(out: Path, record: dict, plan: Plan) -> None:
    """Make `out` ready for this run as `inspect` decided (under the same lock, so nothing changed in between)."""
    if plan == "resume":
        _remove_stale_temps(out)
        return
    manifest = out / MANIFEST_NAME
    if manifest.exists():
        _remove(manifest)
    for child in sorted(out.iterdir()):
        if run_owned(child.name) and child.name not in _KEPT:
            _remove(child)
    write_text_atomic(out / RUN_FILE, json.dumps(record, indent=2, sort_keys=True))
