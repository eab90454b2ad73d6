"""What lies in a run directory: every path the manifest lists stays inside it, and every file in it is one a run writes.

What a run writes is its layout (pipeline.shards.layout.RUN): at its root manifest.json, run.json (its start record),
rejects.parquet (data preparation's rejects) and .lock (the out_dir lock); and the folders shards/ (of which only the
files of the shards the manifest lists and their markers), rejects/ (shard-NNNNN.parquet: the capture rejects of a
unit) and diff/ (the gate's report). Anything else is named: a user's file, a symlink (its target is not the run's to vouch for),
a special file, and the temp file of an interrupted atomic write (`.<name>.<random>.tmp`, which a finished run has
none of).
"""
from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import Iterable

from pipeline.core.outdir import Entry
from pipeline.shards.layout import DIFF_DIR, REJECTS_DIR, RUN, SHARDS_DIR

_WHERE = {REJECTS_DIR: "in rejects/ (capture rejects are shard-NNNNN.parquet)", DIFF_DIR: "in diff/ (the gate's report)"}


def escape_problem(rel: object) -> str | None:
    """Why a path listed in the manifest does not name a file inside the run directory (lexically); None if it does."""
    if not isinstance(rel, str) or not rel.strip():
        return f"listed file {rel!r} is not a relative path"
    if PurePosixPath(rel).is_absolute() or os.path.isabs(rel):
        return f"listed file {rel} is an absolute path: files are listed relative to the run directory"
    if ".." in PurePosixPath(rel).parts or ".." in Path(rel).parts:
        return f"listed file {rel} leaves the run directory (a '..' component)"
    return None


def through_symlink(run_dir: Path, rel: str) -> bool:
    """True when `rel` (already lexically inside the run) or one of its folders is a symlink (named by `tree_problems`)."""
    parts = PurePosixPath(rel).parts
    return any((run_dir.joinpath(*parts[:i])).is_symlink() for i in range(1, len(parts) + 1))


def _problem(entry: Entry, listed: set[str]) -> str | None:
    """What is wrong with one entry of the run directory (pipeline.core.outdir.Layout.walk), or None."""
    rel = entry.rel
    if entry.what == "symlink":
        return f"symlink {rel} -> {os.readlink(entry.path)} in the run directory: a run's files are regular files in it"
    if entry.what == "temp":
        return f"stale temp file {rel}: left by an interrupted write (a finished run has none); remove it"
    if entry.what == "special":
        return f"{rel} is not a regular file"
    kind = "directory" if entry.is_dir else "file"
    if entry.folder == SHARDS_DIR:
        return f"unlisted {kind} {rel} in shards/" if entry.is_dir or rel not in listed else None
    if entry.what == "unknown":
        where = _WHERE.get(entry.folder, "in the run directory")
        return f"unknown {kind} {rel}{'/' if entry.is_dir else ''} {where}: not a file a run writes"
    return None


def tree_problems(run_dir: Path, listed: Iterable[str]) -> list[str]:
    """Every entry of the run directory a run does not write; `listed` are the shard files the manifest lists (and
    their markers), the only files shards/ may hold."""
    listed = set(listed)
    return [problem for entry in RUN.walk(run_dir) if (problem := _problem(entry, listed)) is not None]
