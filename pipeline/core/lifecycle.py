"""One lifecycle for every output directory a job fills (a run, a regeneration, an export, an acceptance report):
what it holds, decided under its lock, and what this job does with it. Each kind is declared once by the code that
owns it (`DirKind`: its layout, its noun, the job that writes it, what finished means, what a replacement keeps, the
error it raises); this module knows none of them.

- new: nothing of the kind, or only what a job that never started leaves (a gate report, rejects of data without one
  valid record, temp files, a replacement cut short): those leftovers are cleared and the job starts;
- resume: an unfinished directory of the same start record (config, data, model, code): finished units are kept;
- complete: for a kind whose finished directory a rerun keeps (an export), that directory finished for this very
  record: nothing to do;
- replace: a finished directory, or an unfinished one of another record, with overwrite given to this process: the
  kind's own files are removed (the completing file first, so a replacement cut short never looks finished), never a
  file the kind does not write, at the root or inside its folders (those make it refuse, naming them); a kind that
  replaces late (an acceptance report) keeps the old files until its writer has the new ones.
Anything else is refused with the kind's error, naming the directory and why. Nothing here deletes a finished
directory unless this process was given overwrite.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Literal, Protocol

from pipeline.core.claim import DirClaim
from pipeline.core.claim import check_lease as claim_check
from pipeline.core.cli import ConfigError, UsageError
from pipeline.core.jsonfile import read_object
from pipeline.core.outdir import Layout, changed, remove, write_json

Plan = Literal["new", "resume", "replace", "complete"]


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
    overwrite: str | None = "overwrite=true"  # what lets a replacement happen; None: nothing does
    wait: str | None = "wait_for_lock=true"  # what makes a claim wait for the holder; None: nothing does
    error: type[UsageError] = ConfigError
    # The record a finished directory's completing file (read as a JSON object, and where it was read) carries, for a
    # kind a rerun of the same work finds complete (an export); None: a finished directory is only ever replaced.
    finished_record: Callable[[dict, str], dict | None] | None = None
    replace_late: bool = False  # its writer replaces a finished directory's files once the new ones are complete

    def name(self, out: Path | str) -> str:
        return f"{self.option}={str(out)!r}" if self.option.isidentifier() else f"{self.option} {out}"

    def hint(self, what: str) -> str:
        """How to go on from a directory this job may not use as it is."""
        return f"choose another {self.option}" + (f", or pass {self.overwrite} to {what}" if self.overwrite else "")


def _a(noun: str) -> str:
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def _resume_hint(previous: dict, record: dict) -> str:
    """How to finish the directory: with its settings, and with the code it started with when that changed (one
    run's units all carry one code version)."""
    code = previous.get("code")
    if not isinstance(code, dict) or code == record.get("code") or not code.get("git_commit"):
        return "resume it with the same settings"
    dirty = " plus the uncommitted changes it ran with" if code.get("dirty") else ""
    return f"resume it with the same settings and the code it started with (git commit {code['git_commit']}{dirty})"


class View(Protocol):
    """What `inspect` reads of a directory, wherever it lies (a local directory: `LocalView`; a store's prefix:
    pipeline.core.store_dir): the decision is written once, here."""

    def exists(self) -> bool: ...
    def foreign(self) -> list[str]: ...  # entries the kind does not write, as `Layout.foreign` names them
    def is_finished(self) -> bool: ...
    def has_start(self) -> bool: ...
    def read_start(self) -> dict: ...  # the kind's error (a UsageError) when it is no JSON object
    def finished_record(self) -> dict | None: ...  # the kind's `finished_record` of a finished directory


@dataclass(frozen=True)
class LocalView:
    out: Path
    kind: DirKind

    def exists(self) -> bool:
        return self.out.exists()

    def foreign(self) -> list[str]:
        return self.kind.layout.foreign(self.out)

    def is_finished(self) -> bool:
        return self.kind.is_finished(self.out)

    def has_start(self) -> bool:
        return bool(self.kind.layout.start) and (self.out / str(self.kind.layout.start)).is_file()

    def read_start(self) -> dict:
        return read_object(self.out / str(self.kind.layout.start), self.kind.error)

    def finished_record(self) -> dict | None:
        path = self.out / str(self.kind.layout.done)
        return self.kind.finished_record(read_object(path, self.kind.error), str(path))


def _start_record(view: View, out: Path | str, kind: DirKind, *, overwrite: bool) -> dict:
    """The start record (bounded, an object); one that is not (a user's edit) is refused naming it unless overwrite
    replaces the directory (then it counts as another job's record)."""
    try:
        return view.read_start()
    except UsageError as exc:
        if not overwrite:
            raise kind.error(f"{kind.name(out)} holds no {kind.noun}'s start record: {exc}; "
                             f"{kind.hint(f'replace that {kind.noun}')}") from None
        return {}


def inspect(out: Path | str, record: dict, *, overwrite: bool, kind: DirKind, view: View | None = None) -> Plan:
    """Read-only: what `prepare` will do with `out` (read through `view`: the local directory by default); the
    kind's error where it must refuse."""
    view = view or LocalView(Path(out), kind)
    if not view.exists():
        return "new"
    foreign = view.foreign()
    finished = view.is_finished()
    previous = _previous(view, out, finished, kind, overwrite=overwrite)
    if finished and kind.finished_record is not None and previous == record:
        return "complete"
    if not finished and previous == record:
        return "resume"
    if finished or previous is not None:
        _replaceable(out, record, previous, finished, foreign, overwrite=overwrite, kind=kind)
        return "replace"
    if foreign:
        raise kind.error(f"{kind.name(out)} is not empty and holds no {kind.noun} ({', '.join(foreign[:8])}); choose "
                         f"an empty or new directory")
    return "new"


def _previous(view: View, out: Path | str, finished: bool, kind: DirKind, *, overwrite: bool) -> dict | None:
    """The record of the work `out` holds: the finished one's for a kind that keeps it, else the start record's."""
    if kind.finished_record is not None and finished:
        try:
            return view.finished_record() or {}
        except UsageError as exc:
            raise kind.error(f"{kind.name(out)} holds a finished {kind.noun} this job cannot read: {exc}; "
                             f"{kind.hint(f'replace that {kind.noun}')}") from None
    return _start_record(view, out, kind, overwrite=overwrite) if view.has_start() else None


def _replaceable(out: Path | str, record: dict, previous: dict | None, finished: bool, foreign: list[str], *,
                 overwrite: bool, kind: DirKind) -> None:
    """Nothing when this process may replace the other work `out` holds; the kind's error naming it otherwise."""
    noun, name = kind.noun, kind.name(out)
    differs = f" with a different {', '.join(changed(previous, record))}" if previous is not None else ""
    what = f"a finished {noun} ({kind.layout.done}){differs if kind.finished_record else ''}" if finished else \
        f"an unfinished {noun}{differs}"
    if not overwrite or kind.overwrite is None:
        hint = kind.hint("replace it")
        hint = hint if finished else f"{_resume_hint(previous, record)}, {hint}"
        raise kind.error(f"{name} holds {what}; {hint}")
    if foreign:
        raise kind.error(f"{name} holds {what} and files {_a(noun)} does not write ({', '.join(foreign[:8])}); "
                         f"{kind.overwrite} removes only {_a(noun)}'s own files: move those first")


def keeps_all(plan: Plan, kind: DirKind) -> bool:
    """Whether `prepare` leaves what the directory holds (on disk or a store): a resume, a finished directory this job
    wrote already, a replacement by a kind whose writer replaces the files late."""
    return plan in ("resume", "complete") or (plan == "replace" and kind.replace_late)


def prepare(out: Path, record: dict, plan: Plan, kind: DirKind) -> None:
    """Make `out` ready for this job as `inspect` decided (under the same lock, so nothing changed in between)."""
    layout = kind.layout
    if keeps_all(plan, kind):
        layout.remove_stale_temps(out)
        return
    done = out / str(layout.done)
    if done.exists():
        remove(done)  # first: a replacement cut short never looks finished
    for child in sorted(out.iterdir()):
        if layout.owns(child.name) and child.name not in kind.kept:
            remove(child)
    if layout.start is not None:
        write_json(out / str(layout.start), record)


def refusals(out: Path | str, kind: DirKind) -> tuple[Callable[[str], str], Callable[[str], str]]:
    """What a claim says when another job holds `out`: refusing, and waiting (given the holder)."""
    name = kind.name(out)
    wait_hint = f". Wait for it to finish, or pass {kind.wait} to wait here" if kind.wait else \
        ". Wait for it to finish, or choose another directory"
    return (lambda holder: f"{name} is in use by {holder}: another {kind.job} is writing it{wait_hint}",
            lambda holder: f"{name} is in use by {holder}; waiting for it ({kind.wait})")


def claim(out: Path, *, wait: bool = False, kind: DirKind) -> DirClaim:
    """The output directory for this process alone, from the decision about what it holds to its completing file. A
    kind with a lock file gets a lease there, which lets writers on other hosts check they still write for this job
    (`check_lease`); one without has the directory itself locked, so no file is added that a trainer could list."""
    refusal, waiting = refusals(out, kind)
    lock = kind.layout.lock
    return DirClaim(out, lock_file=lock, lease=lock is not None, wait=wait, refusal=refusal, waiting=waiting)


def check_lease(out: Path, token: str | None, kind: DirKind) -> None:
    """ClaimLost unless the directory's lease still carries `token` (None: no lease in use)."""
    claim_check(Path(out) / str(kind.layout.lock), token, what=kind.name(out),
                then="stopped before finishing another unit")


@dataclass
class Held:
    """An output directory claimed for one job (`held`): what `inspect` decided, the lease token its writers check,
    `prepare` once the job may write, and `finish` that writes the completing file only while the lease is still
    this job's."""

    out: Path
    record: dict
    plan: Plan
    token: str | None
    kind: DirKind
    target: None = None  # the directory is on disk (pipeline.core.store_dir.StoreHeld: on a store)

    def prepare(self) -> None:
        prepare(self.out, self.record, self.plan, self.kind)

    def finish(self, write: Callable[[], None]) -> None:
        check_lease(self.out, self.token, self.kind)  # still this job's directory: only then may it be finished
        write()


@contextmanager
def held(out: Path, record: dict, *, kind: DirKind, wait: bool, overwrite: bool) -> Iterator[Held]:
    """The one sequence of every job that fills a directory: claim it, decide what it holds (refused here, before
    any engine starts), then the job prepares, writes its units and finishes it, all under the claim."""
    with claim(out, wait=wait, kind=kind) as lock:
        yield Held(out=out, record=record, plan=inspect(out, record, overwrite=overwrite, kind=kind),
                   token=lock.token, kind=kind)
