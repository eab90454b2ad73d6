"""What the run directory (its layout: pipeline.shards.layout.RUN) holds, decided under its lock, and what this run
does with it.

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

from pathlib import Path
from typing import Literal

from pipeline.config import ConfigError
from pipeline.core.claim import DirClaim
from pipeline.core.claim import check_lease as claim_check
from pipeline.core.jsonfile import read_object
from pipeline.core.outdir import changed, remove, write_json
from pipeline.shards.layout import DIFF_DIR, LOCK_NAME, MANIFEST_NAME, RUN, RUN_FILE
from pipeline.shards.manifest import is_finished

Plan = Literal["new", "resume", "replace"]
_KEPT = (LOCK_NAME, DIFF_DIR)  # the lock being held, and this run's own gate report


def _resume_hint(previous: dict, record: dict) -> str:
    """How to finish the run: with its settings, and with the code it started with when that changed (one run's
    shards all carry one code version)."""
    code = previous.get("code")
    if not isinstance(code, dict) or code == record.get("code") or not code.get("git_commit"):
        return "resume it with the same settings"
    dirty = " plus the uncommitted changes it ran with" if code.get("dirty") else ""
    return f"resume it with the same settings and the code it started with (git commit {code['git_commit']}{dirty})"


def _start_record(out: Path, marker: Path, *, overwrite: bool) -> dict:
    """The start record in `marker` (bounded, an object); one that is not (a user's edit) is refused naming it unless
    overwrite=true replaces the run (then it counts as another run's record)."""
    try:
        return read_object(marker, ConfigError)
    except ConfigError as exc:
        if not overwrite:
            raise ConfigError(f"out_dir={str(out)!r} holds no run's start record: {exc}; choose another out_dir, or "
                              "pass overwrite=true to replace that run") from None
        return {}


def inspect(out: Path, record: dict, *, overwrite: bool) -> Plan:
    """Read-only: what `prepare` will do with `out`; ConfigError where it must refuse."""
    if not out.exists():
        return "new"
    foreign = RUN.foreign(out)
    marker = out / RUN_FILE
    previous = _start_record(out, marker, overwrite=overwrite) if marker.is_file() else None
    finished = is_finished(out)
    if not finished and previous == record:
        return "resume"
    if finished or previous is not None:
        what = "a finished run (manifest.json)" if finished else \
            f"an unfinished run with a different {', '.join(changed(previous, record))}"
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


def prepare(out: Path, record: dict, plan: Plan) -> None:
    """Make `out` ready for this run as `inspect` decided (under the same lock, so nothing changed in between)."""
    if plan == "resume":
        RUN.remove_stale_temps(out)
        return
    manifest = out / MANIFEST_NAME
    if manifest.exists():
        remove(manifest)
    for child in sorted(out.iterdir()):
        if RUN.owns(child.name) and child.name not in _KEPT:
            remove(child)
    write_json(out / RUN_FILE, record)


def claim(out: Path, *, wait: bool) -> DirClaim:
    """The run directory for this process alone, from the decision about what it holds to the manifest; its lease
    lets writers on other hosts check they still write for this run (`check_lease`)."""
    name = f"out_dir={str(out)!r}"
    return DirClaim(out, lock_file=RUN.lock, lease=True, wait=wait,
                    refusal=lambda holder: f"{name} is in use by {holder}: another extract is writing it. Wait for it "
                                           f"to finish, or pass wait_for_lock=true to wait here",
                    waiting=lambda holder: f"{name} is in use by {holder}; waiting for it (wait_for_lock=true)")


def check_lease(out: Path, token: str | None) -> None:
    """ClaimLost unless the run directory's lease still carries `token` (None: no lease in use)."""
    claim_check(Path(out) / LOCK_NAME, token, what=f"out_dir={str(out)!r}",
                then="stopped before finishing another shard")
