"""What a job's output directory holds, decided under its lock, and what this job does with it: a run directory
(its layout: pipeline.shards.layout.RUN, written by extract) or a regeneration directory (pipeline.regen.layout,
written by regenerate), each described once by a `DirKind`.

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

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal

from pipeline.config import ConfigError
from pipeline.core.claim import DirClaim
from pipeline.core.claim import check_lease as claim_check
from pipeline.core.jsonfile import read_object
from pipeline.core.outdir import Layout, changed, remove, write_json
from pipeline.shards.layout import DIFF_DIR, LOCK_NAME, RUN
from pipeline.shards.manifest import is_finished

Plan = Literal["new", "resume", "replace"]


@dataclass(frozen=True, kw_only=True)
class DirKind:
    """One kind of output directory: its layout, what it is called in messages, the job that writes it, the entries a
    replacement keeps (the lock being held, reports written before the job starts) and when it counts as finished."""

    layout: Layout
    noun: str  # "run": "a finished run", "holds no run's start record"
    job: str  # "extract": "another extract is writing it"
    kept: tuple[str, ...]
    is_finished: Callable[[Path], bool]


RUN_DIR = DirKind(layout=RUN, noun="run", job="extract", kept=(LOCK_NAME, DIFF_DIR), is_finished=is_finished)


def _resume_hint(previous: dict, record: dict) -> str:
    """How to finish the run: with its settings, and with the code it started with when that changed (one run's
    shards all carry one code version)."""
    code = previous.get("code")
    if not isinstance(code, dict) or code == record.get("code") or not code.get("git_commit"):
        return "resume it with the same settings"
    dirty = " plus the uncommitted changes it ran with" if code.get("dirty") else ""
    return f"resume it with the same settings and the code it started with (git commit {code['git_commit']}{dirty})"


def _start_record(out: Path, marker: Path, *, overwrite: bool, noun: str = "run") -> dict:
    """The start record in `marker` (bounded, an object); one that is not (a user's edit) is refused naming it unless
    overwrite=true replaces the run (then it counts as another run's record)."""
    try:
        return read_object(marker, ConfigError)
    except ConfigError as exc:
        if not overwrite:
            raise ConfigError(f"out_dir={str(out)!r} holds no {noun}'s start record: {exc}; choose another out_dir, "
                              f"or pass overwrite=true to replace that {noun}") from None
        return {}


def inspect(out: Path, record: dict, *, overwrite: bool, kind: DirKind = RUN_DIR) -> Plan:
    """Read-only: what `prepare` will do with `out`; ConfigError where it must refuse."""
    if not out.exists():
        return "new"
    noun = kind.noun
    foreign = kind.layout.foreign(out)
    marker = out / str(kind.layout.start)
    previous = _start_record(out, marker, overwrite=overwrite, noun=noun) if marker.is_file() else None
    finished = kind.is_finished(out)
    if not finished and previous == record:
        return "resume"
    if finished or previous is not None:
        what = f"a finished {noun} ({kind.layout.done})" if finished else \
            f"an unfinished {noun} with a different {', '.join(changed(previous, record))}"
        if not overwrite:
            hint = "choose another out_dir, or pass overwrite=true to replace it" if finished else \
                f"{_resume_hint(previous, record)}, choose another out_dir, or pass overwrite=true to replace it"
            raise ConfigError(f"out_dir={str(out)!r} holds {what}; {hint}")
        if foreign:
            raise ConfigError(f"out_dir={str(out)!r} holds {what} and files a {noun} does not write "
                              f"({', '.join(foreign[:8])}); overwrite=true removes only a {noun}'s own files: move "
                              f"those first")
        return "replace"
    if foreign:
        raise ConfigError(f"out_dir={str(out)!r} is not empty and holds no {noun} ({', '.join(foreign[:8])}); choose "
                          f"an empty or new directory")
    return "new"


def prepare(out: Path, record: dict, plan: Plan, kind: DirKind = RUN_DIR) -> None:
    """Make `out` ready for this job as `inspect` decided (under the same lock, so nothing changed in between)."""
    layout = kind.layout
    if plan == "resume":
        layout.remove_stale_temps(out)
        return
    done = out / str(layout.done)
    if done.exists():
        remove(done)  # first: a replacement cut short never looks finished
    for child in sorted(out.iterdir()):
        if layout.owns(child.name) and child.name not in kind.kept:
            remove(child)
    write_json(out / str(layout.start), record)


def claim(out: Path, *, wait: bool, kind: DirKind = RUN_DIR) -> DirClaim:
    """The output directory for this process alone, from the decision about what it holds to its completing file; its
    lease lets writers on other hosts check they still write for this job (`check_lease`)."""
    name = f"out_dir={str(out)!r}"
    return DirClaim(out, lock_file=kind.layout.lock, lease=True, wait=wait,
                    refusal=lambda holder: f"{name} is in use by {holder}: another {kind.job} is writing it. Wait for "
                                           f"it to finish, or pass wait_for_lock=true to wait here",
                    waiting=lambda holder: f"{name} is in use by {holder}; waiting for it (wait_for_lock=true)")


def check_lease(out: Path, token: str | None, lock_name: str = LOCK_NAME) -> None:
    """ClaimLost unless the directory's lease still carries `token` (None: no lease in use)."""
    claim_check(Path(out) / lock_name, token, what=f"out_dir={str(out)!r}",
                then="stopped before finishing another unit")
