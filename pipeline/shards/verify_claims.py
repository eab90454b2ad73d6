"""The manifest's claims that its shards do not carry, against what the run directory lets verify recompute.

- `provenance_digest` is the digest of the stored `provenance` (an edit of the data path or of max_length changes it);
- the provenance's resolved config, model digests, code and data digest are those of run.json, the record the run
  started from (and that a resume must match), when the run directory holds one;
- `rejects` (total and by reason) counts the rows of rejects.parquet and of the capture rejects under rejects/, and
  each reject's id is its row's (verify_samples.py);
- `num_truncated` counts the shards' rows whose `truncated` flag is set; no rejected sample is also in a shard.

A manifest that records no provenance or no reject counts at all (one not written by `pipeline.extract`) is held only
to what it records.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from pipeline import provenance
from pipeline.core.jsonfile import read
from pipeline.shards.layout import PREPARE_REJECTS, REJECTS_DIR, RUN, RUN_FILE
from pipeline.shards.verify_samples import SampleRows, data_digest, id_problems

_MAX_LISTED = 3


def provenance_problems(run_dir: Path, manifest: dict[str, Any]) -> list[str]:
    prov, stored = manifest.get("provenance"), manifest.get("provenance_digest")
    if not prov and stored is None:
        return []
    if not isinstance(prov, dict):
        return [f"manifest provenance is a {type(prov).__name__}, not a provenance record"]
    try:
        recomputed = provenance.digest(prov)
    except (TypeError, ValueError, AttributeError) as exc:
        return [f"manifest provenance cannot be digested ({type(exc).__name__}: {exc})"]
    problems = []
    if stored != recomputed:
        problems.append(f"manifest provenance_digest {stored!r} != {recomputed!r}, the digest of its provenance "
                        "(the provenance or its digest was edited after the run)")
    return problems + _start_record_problems(run_dir, prov)


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        return {k: v for key, sub in value.items() for k, v in _flat(sub, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): value}


def _start_record_problems(run_dir: Path, prov: dict[str, Any]) -> list[str]:
    path = run_dir / RUN_FILE
    if not path.is_file() or path.is_symlink():
        return []
    try:
        record = read(path, ValueError)  # bounded in size and nesting
        model = prov.get("model") or {}
        claimed = {"config": provenance.stable_config(prov.get("config") or {}), "code": prov.get("code"),
                   "model_config_sha256": model.get("config_sha256"),
                   "weights_sha256": (model.get("weights") or {}).get("sha256")}
        if "data" in prov:  # the data file's digest (recorded in provenance since format 3): every sample id's seed
            claimed["data_digest"] = (prov["data"] or {}).get("sha256")
        started = {key: record[key] for key in claimed}
    except ValueError as exc:
        return [f"{RUN_FILE} is not a run's start record: {exc}"]
    except (TypeError, KeyError, AttributeError) as exc:
        return [f"{RUN_FILE} is not a run's start record ({type(exc).__name__}: {exc})"]
    flat_claimed, flat_started = _flat(claimed), _flat(started)
    changed = sorted(k for k in set(flat_claimed) | set(flat_started) if flat_claimed.get(k) != flat_started.get(k))
    return [f"manifest provenance {_where(key)} {flat_claimed.get(key)!r} != {flat_started.get(key)!r} in {RUN_FILE}, "
            "the record the run started from" for key in changed[:_MAX_LISTED]] + (
        [f"manifest provenance differs from {RUN_FILE} in {len(changed) - _MAX_LISTED} more key(s)"]
        if len(changed) > _MAX_LISTED else [])


def _where(key: str) -> str:
    return key.removeprefix("config.") if key.startswith("config.") else key


def _reject_tables(run_dir: Path) -> tuple[list[tuple[str, dict[str, list]]], list[str]]:
    """(relative path, its sample_id, row and reason columns) of every rejects file, and the problems of the unreadable
    ones."""
    paths = [run_dir / PREPARE_REJECTS]
    folder = run_dir / REJECTS_DIR
    if folder.is_dir() and not folder.is_symlink():
        paths += sorted(p for p in folder.iterdir() if RUN.holds(REJECTS_DIR, p.name))
    tables, problems = [], []
    for path in paths:
        rel = path.relative_to(run_dir).as_posix()
        if path.is_symlink() or not path.is_file():
            continue  # absent (no rejects were written) or a symlink (named by the tree check)
        try:
            table = pq.read_table(path, columns=["sample_id", "row", "reason"]).to_pydict()
        except (OSError, ValueError, KeyError) as exc:
            problems.append(f"{rel}: unreadable rejects file ({type(exc).__name__}: {exc})")
            continue
        tables.append((rel, table))
    return tables, problems


def reject_problems(run_dir: Path, manifest: dict[str, Any], shard_ids: set[str]) -> list[str]:
    tables, problems = _reject_tables(run_dir)
    rejected = SampleRows()
    for rel, table in tables:
        rejected.add(rel, {**table, "num_tokens": [None] * len(table["row"])})
    problems += id_problems(rejected, data_digest(run_dir), where="rejects")
    counted = Counter(reason for _, table in tables for reason in table["reason"])
    total = sum(counted.values())
    claim = manifest.get("rejects")
    where = f"{PREPARE_REJECTS} and {REJECTS_DIR}/"
    if not claim:
        if total:
            problems.append(f"manifest records no reject counts, {where} hold {total} rejects")
    elif not isinstance(claim, dict):
        problems.append(f"manifest rejects is a {type(claim).__name__}, not reject counts")
    else:
        if claim.get("total") != total:
            problems.append(f"manifest rejects total={claim.get('total')!r} but {where} hold {total} rejects")
        if claim.get("by_reason") != dict(counted):
            problems.append(f"manifest rejects by_reason={claim.get('by_reason')!r} but {where} hold "
                            f"{dict(sorted(counted.items()))}")
        problems += _listed_rejects_problems(claim.get("files", []))
    both = sorted({(rel, sid) for rel, table in tables for sid in table["sample_id"] if sid in shard_ids})
    problems += [f"{rel}: rejected sample {sid!r} is also in a shard" for rel, sid in both[:_MAX_LISTED]]
    if len(both) > _MAX_LISTED:
        problems.append(f"{len(both) - _MAX_LISTED} more rejected sample(s) are also in shards")
    return problems


def _listed_rejects_problems(files: Any) -> list[str]:
    known = [PREPARE_REJECTS, f"{REJECTS_DIR}/"]
    if files != known:
        return [f"manifest rejects files {files!r} != {known}: rejects are written there and nowhere else"]
    return []


def truncation_problems(manifest: dict[str, Any], num_truncated: int) -> list[str]:
    if "num_truncated" in manifest and manifest["num_truncated"] != num_truncated:
        return [f"manifest num_truncated={manifest['num_truncated']!r} but its shards hold {num_truncated} "
                "truncated samples"]
    return []
