"""Verify a finished run directory: every problem is reported as one specific line; an empty list means sound.

Checks, in order: the manifest parses and has what the format needs; every listed file is a path inside the run
directory (no '..', not absolute, not through a symlink) that exists with the recorded size and sha256; the safetensors
library and the writer's own parser both accept each shard's header and read it alike (st_library.py); each shard's
header, offsets, finiteness and Parquet rows agree with the manifest (verify_shard.py), its metadata included: engine,
capture convention, model and code as the manifest's provenance records them; sample ids are unique across the run;
totals equal the manifest's counts; every sample id is its data row's, rows in the data's order, no sample longer
than data.max_length (verify_samples.py); the manifest's other claims (provenance digest, start record, reject and
truncation counts) hold (verify_claims.py); the run directory holds nothing a run does not write: no unlisted shard
file, user file, symlink or stale temp file (verify_tree.py); and every file is what the run's attestation says,
signed by `key` when one is given (attestation.py).
"""
from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from pipeline.core.io import sha256_file
from pipeline.provenance import compact
from pipeline.shards import attestation, layout
from pipeline.shards.manifest import ManifestError, read_manifest
from pipeline.shards.staged import Fetch
from pipeline.shards.storage import of_manifest, parse
from pipeline.shards.verify_claims import (
    provenance_problems,
    reject_problems,
    truncation_problems,
)
from pipeline.shards.verify_samples import SampleRows, sample_problems
from pipeline.shards.verify_shard import Expected, check_shard
from pipeline.shards.verify_tree import (
    escape_problem,
    through_symlink,
    tree_problems,
)
from pipeline.shards.writer import ShardEntry

_DATA_SUFFIXES = (layout.SHARD_SUFFIXES["safetensors"], layout.SHARD_SUFFIXES["parquet"])


def _expected(manifest: dict[str, Any]) -> tuple[Expected | None, list[str]]:
    points, hidden_size, dtype = manifest["points"], manifest["hidden_size"], manifest["dtype"]
    problems = []
    if not (isinstance(points, list) and points and all(isinstance(p, str) for p in points)):
        problems.append(f"manifest points={points!r} is not a non-empty list of labels")
    if not (isinstance(hidden_size, int) and hidden_size > 0):
        problems.append(f"manifest hidden_size={hidden_size!r} is not a positive integer")
    if dtype not in layout.HIDDEN_DTYPES:
        problems.append(f"manifest dtype={dtype!r} is not one of {', '.join(layout.HIDDEN_DTYPES)}")
    if not isinstance(manifest["shards"], list):
        problems.append(f"manifest shards is a {type(manifest['shards']).__name__}, not a list")
    try:
        storage = of_manifest(manifest)
    except ValueError as exc:
        problems.append(f"manifest storage: {exc}")
    else:
        if storage.dtype != dtype:
            problems.append(f"manifest storage dtype {storage.dtype!r} != manifest dtype {dtype!r}")
    if problems:
        return None, problems
    return Expected(points=points, hidden_size=hidden_size, dtype=dtype, storage=storage,
                    version=str(manifest["format_version"]),
                    provenance=_shard_provenance(manifest.get("provenance"))), []


# What every shard must share with its run. Not the diff gate's summary (nor the digest over it): a resumed run
# re-runs the gate, and an engine that is not deterministic gives other figures without the shards being different.
SHARED_PROVENANCE = ("engine", "capture", "model", "code")


def _shard_provenance(prov: Any) -> dict[str, str] | None:
    """The shard metadata a pipeline provenance record implies; None for a manifest without one."""
    try:
        implied = compact(prov)
    except (KeyError, TypeError):
        return None
    return {k: implied[k] for k in SHARED_PROVENANCE}


def _entries(manifest: dict[str, Any], expect: Expected) -> tuple[list[ShardEntry], list[str]]:
    entries, problems = [], []
    for i, raw in enumerate(manifest["shards"]):
        try:
            entry = ShardEntry.from_dict(raw)
        except (TypeError, ValueError) as exc:
            problems.append(f"manifest shards[{i}] is not a shard entry: {exc}")
            continue
        if entry.dtype != expect.dtype:
            problems.append(f"{entry.name}: dtype {entry.dtype!r} != manifest dtype {expect.dtype!r}")
        if entry.points != expect.points:
            problems.append(f"{entry.name}: points {entry.points} != manifest points {expect.points}")
        problems += _entry_storage_problems(entry, expect)
        entries.append(entry)
    names = [e.name for e in entries]
    problems += [f"shard {n} is listed {names.count(n)} times" for n in sorted(set(names)) if names.count(n) > 1]
    return entries, problems


def _entry_storage_problems(entry: ShardEntry, expect: Expected) -> list[str]:
    try:
        storage = parse(entry.storage)
    except ValueError as exc:
        return [f"{entry.name}: storage: {exc}"]
    if storage != expect.storage:
        return [f"{entry.name}: storage {storage.to_dict()} != manifest storage {expect.storage.to_dict()}"]
    sums = [entry.storage.get(k) for k in ("sq_err", "sq_ref")] if storage.scaled else []
    if any(not (isinstance(v, list) and len(v) == len(expect.points)) for v in sums):
        return [f"{entry.name}: storage rounding sums are not one number per point"]
    return []


def _outside(run_dir: Path, entry: ShardEntry) -> tuple[set[str], list[str]]:
    """The listed files of `entry` that are not plain paths inside the run (never read), and why: '..' and absolute
    paths here; a path through a symlink is named once, by the tree check."""
    outside, problems = set(), []
    if not layout.SHARD_NAME.fullmatch(entry.name):
        problems.append(f"{entry.name}: shard name is not shard-NNNNN")
    for rel in sorted(entry.files):
        problem = escape_problem(rel)
        if problem is not None:
            problems.append(f"{entry.name}: {problem}")
            outside.add(rel)
        elif through_symlink(run_dir, rel):
            outside.add(rel)
        elif rel not in (home := {f"{layout.SHARDS_DIR}/{entry.name}{s}" for s in _DATA_SUFFIXES}):
            problems.append(f"{entry.name}: listed file {rel} is not one of the shard's own files {sorted(home)}")
            outside.add(rel)
    return outside, problems


def _file_problems(run_dir: Path, entry: ShardEntry, outside: set[str], hashed: dict[str, str]) -> list[str]:
    """The listed files against their records; `hashed` gets the sha256 of every file read."""
    problems = []
    for rel, info in sorted(entry.files.items()):
        path = run_dir / rel
        if rel in outside:
            continue
        if not path.is_file():
            problems.append(f"{entry.name}: listed file {rel} is missing")
        elif path.stat().st_size != info.get("bytes"):
            problems.append(f"{entry.name}: {rel} has {path.stat().st_size} bytes, manifest says {info.get('bytes')}")
        elif (digest := hashed.setdefault(rel, sha256_file(path))) != info.get("sha256"):
            problems.append(f"{entry.name}: {rel} sha256 {digest} != manifest {info.get('sha256')}")
    return problems


def _shard_files(run_dir: Path, entry: ShardEntry) -> tuple[Path, Path] | str:
    """The shard's (.safetensors, .parquet) paths, or why its contents cannot be checked."""
    by_suffix = {suffix: [rel for rel in entry.files if rel.endswith(suffix)] for suffix in _DATA_SUFFIXES}
    if any(len(rels) != 1 for rels in by_suffix.values()):
        return f"{entry.name}: needs one .safetensors and one .parquet file, manifest lists {sorted(entry.files)}"
    st, pq = (run_dir / by_suffix[s][0] for s in _DATA_SUFFIXES)
    return (st, pq) if st.is_file() and pq.is_file() else ""  # missing files are already reported


def _total_problems(manifest: dict[str, Any], entries: list[ShardEntry]) -> list[str]:
    keys = ["num_samples", "num_tokens"] + (["num_loss_tokens"] if "num_loss_tokens" in manifest else [])
    totals = {key: sum(getattr(e, key) for e in entries) for key in keys}
    return [f"manifest {key}={manifest[key]} but its shards hold {total}"
            for key, total in totals.items() if manifest[key] != total]


def _duplicate_problems(owners: dict[str, list[str]]) -> list[str]:
    return [f"sample_id {sample_id!r} appears {len(names)} times (in {', '.join(names)})"
            for sample_id, names in owners.items() if len(names) > 1]


def _listed(entries: list[ShardEntry]) -> set[str]:
    """The files shards/ may hold: the listed files and the completion marker of every listed shard."""
    marker = layout.SHARD_SUFFIXES["marker"]
    return {rel for e in entries for rel in e.files} | {f"{layout.SHARDS_DIR}/{e.name}{marker}" for e in entries}


def verify_run(run_dir: Path, *, key: Ed25519PublicKey | None = None, fetch: Fetch | None = None) -> list[str]:
    """Every problem found in `run_dir`, each as one line naming the shard or file, the field and both values; with
    `key`, also an attestation that key did not sign (attestation.py). `fetch`: a run staged from object storage
    (pipeline.shards.staged), whose shard states are in place only while their shard is checked."""
    run_dir = Path(run_dir)
    try:
        manifest = read_manifest(run_dir)
    except ManifestError as exc:
        return [str(exc)]
    expect, problems = _expected(manifest)
    if expect is None:
        return problems
    entries, problems = _entries(manifest, expect)
    owners: dict[str, list[str]] = {}
    samples = SampleRows()
    hashed: dict[str, str] = {}  # sha256 of the files read, so the attestation's check reads none twice
    num_truncated, rows_read = 0, True  # the truncation count is checked only when every shard's rows were read
    for entry in entries:  # shard by shard, so memory stays at one shard's index tensors plus one chunk
        outside, entry_problems = _outside(run_dir, entry)
        with fetch(entry) if fetch is not None else nullcontext():
            problems += entry_problems + _file_problems(run_dir, entry, outside, hashed)
            files = "" if outside else _shard_files(run_dir, entry)
            if isinstance(files, str):
                problems += [files] if files else []
                rows_read = False
                continue
            shard_problems, table = check_shard(*files, entry, expect)
        problems += shard_problems
        ids = table.get("sample_id", [])
        num_truncated += sum(bool(flag) for flag in table.get("truncated", []))
        rows_read = rows_read and bool(ids)
        samples.add(entry.name, table)
        for sample_id in ids:
            owners.setdefault(sample_id, []).append(entry.name)
    return problems + _total_problems(manifest, entries) + _duplicate_problems(owners) \
        + sample_problems(run_dir, manifest, samples) \
        + (truncation_problems(manifest, num_truncated) if rows_read else []) + provenance_problems(run_dir, manifest) \
        + reject_problems(run_dir, manifest, set(owners)) + tree_problems(run_dir, _listed(entries)) \
        + attestation.problems(run_dir, manifest, key, hashed)
