"""One lifecycle for every output directory a job fills (a run, a regeneration): what it holds, decided under its
lock, and what this job does with it. Each kind is declared once by the code that owns it (`DirKind`: its layout,
its noun, the job that writes it, what finished means, what a replacement keeps, the error it raises); this module
knows none of them.

- new: nothing of the kind, or only what a job that never started leaves (a gate report, rejects of data without one
  valid record, temp files, a replacement cut short): those leftovers are cleared and the job starts;
- resume: an unfinished directory of the same start record (config, data, model, code): finished units are kept;
- replace: a finished directory, or an unfinished one of another record, with overwrite given to this process: the
  kind's own files are removed (the completing file first, so a replacement cut short never looks finished), never a
  file the kind does not write, at the root or inside its folders (those make it refuse, naming them).
Anything else is refused with the kind's error, naming the directory and why. Nothing here deletes a finished
directory unless this process was given overwrite.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal

from pipeline.core.claim import DirClaim
from pipeline.core.claim import check_lease as claim_check
from pipeline.core.cli import ConfigError, UsageError
from pipeline.core.jsonfile import read_object
from pipeline.core.outdir import Layout, changed, remove, write_json

Plan = Literal["new", "resume", "replace"]


@dataclass(frozen=True, kw_only=True)
class DirKind:
    """One kind of output directory: its layout, what it is called in messages, the job that writes it, the entries a
    replacement keeps (the lock being held, reports written before the job starts), when it counts as finished, how
    a message names the directory and the error a refusal raises."""

    layout: Layout
    noun: str  # "run": "a finished run", "holds no run's start record"
    job: str  # "extract": "another extract is writing it"
    kept: tuple[str, ...]
    is_finished: Callable[[Path], bool]
    option: str = "out_dir"  # the setting that names the directory: `out_dir='/data/r1' holds ...`
    overwrite: str = "overwrite=true"  # what lets a replacement happen
    error: type[UsageError] = ConfigError

    def name(self, out: Path) -> str:
        return f"{self.option}={str(out)!r}"


def _resume_hint(previous: dict, record: dict) -> str:
    """How to finish the directory: with its settings, and with the code it started with when that changed (one
    run's units all carry one code version)."""
    code = previous.get("code")
    if not isinstance(code, dict) or code == record.get("code") or not code.get("git_commit"):
        return "resume it with the same settings"
    dirty = " plus the uncommitted changes it ran with" if code.get("dirty") else ""
    return f"resume it with the same settings and the code it started with (git commit {code['git_commit']}{dirty})"


def _start_record(out: Path, kind: DirKind, *, overwrite: bool) -> dict:
    """The start record (bounded, an object); one that is not (a user's edit) is refused naming it unless overwrite
    replaces the directory (then it counts as another job's record)."""
    try:
        return read_object(out / str(kind.layout.start), kind.error)
    except UsageError as exc:
        if not overwrite:
            raise kind.error(f"{kind.name(out)} holds no {kind.noun}'s start record: {exc}; choose another "
                             f"{kind.option}, or pass {kind.overwrite} to replace that {kind.noun}") from None
        return {}


def inspect(out: Path, record: dict, *, overwrite: bool, kind: DirKind) -> Plan:
    """Read-only: what `prepare` will do with `out`; the kind's error where it must refuse."""
    if not out.exists():
        return "new"
    noun, name = kind.noun, kind.name(out)
    foreign = kind.layout.foreign(out)
    marker = out / str(kind.layout.start)
    previous = _start_record(out, kind, overwrite=overwrite) if marker.is_file() else None
    finished = kind.is_finished(out)
    if not finished and previous == record:
        return "resume"
    if finished or previous is not None:
        what = f"a finished {noun} ({kind.layout.done})" if finished else \
            f"an unfinished {noun} with a different {', '.join(changed(previous, record))}"
        if not overwrite:
            hint = f"choose another {kind.option}, or pass {kind.overwrite} to replace it"
            hint = hint if finished else f"{_resume_hint(previous, record)}, {hint}"
            raise kind.error(f"{name} holds {what}; {hint}")
        if foreign:
            raise kind.error(f"{name} holds {what} and files a {noun} does not write ({', '.join(foreign[:8])}); "
                             f"{kind.overwrite} removes only a {noun}'s own files: move those first")
        return "replace"
    if foreign:
        raise kind.error(f"{name} is not empty and holds no {noun} ({', '.join(foreign[:8])}); choose an empty or "
                         f"new directory")
    return "new"


def prepare(out: Path, record: dict, plan: Plan, kind: DirKind) -> None:
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


def claim(out: Path, *, wait: bool, kind: DirKind) -> DirClaim:
    """The output directory for this process alone, from the decision about what it holds to its completing file; its
    lease lets writers on other hosts check they still write for this job (`check_lease`)."""
    name = kind.name(out)
    return DirClaim(out, lock_file=kind.layout.lock, lease=True, wait=wait,
                    refusal=lambda holder: f"{name} is in use by {holder}: another {kind.job} is writing it. Wait for "
                                           f"it to finish, or pass wait_for_lock=true to wait here",
                    waiting=lambda holder: f"{name} is in use by {holder}; waiting for it (wait_for_lock=true)")


def check_lease(out: Path, token: str | None, kind: DirKind) -> None:
    """ClaimLost unless the directory's lease still carries `token` (None: no lease in use)."""
    claim_check(Path(out) / str(kind.layout.lock), token, what=kind.name(out),
                then="stopped before finishing another unit")
