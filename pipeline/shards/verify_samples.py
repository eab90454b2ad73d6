"""The claims every Parquet row makes about its sample that verify can recompute from the run's start record.

- a sample id is `sha256(data_digest:row)` (pipeline.data.ids.sample_id_for) of the data file's digest that
  run.json records: a row whose id is not its own (two samples' ids swapped, and their checksums recomputed) would
  make `RunReader` serve one sample under another's id;
- samples are stored in the data's order (units are cut from the prepared samples in input order, and the manifest
  lists them by unit), so the rows increase across the whole run;
- no sample is longer than the `data.max_length` the provenance records.

(Each row's offset, length and token digest against the tensors are checked per shard: verify_shard.py.)
A run directory without run.json (one pipeline.extract did not start), or a manifest without a provenance record, is
held only to what it records.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.core.jsonfile import read_lenient
from pipeline.data.ids import sample_id_for
from pipeline.shards.layout import RUN_FILE

_MAX_LISTED = 3  # per kind of problem, list this many and count the rest


@dataclass
class SampleRows:
    """Every shard's rows, in storage order: (shard, sample_id, row, num_tokens)."""

    rows: list[tuple[str, Any, Any, Any]] = field(default_factory=list)

    def add(self, shard: str, table: dict[str, list]) -> None:
        columns = [table.get(c) or [] for c in ("sample_id", "row", "num_tokens")]
        if len({len(c) for c in columns}) == 1:
            self.rows += [(shard, *values) for values in zip(*columns)]


def data_digest(run_dir: Path) -> str | None:
    """The data file's digest run.json records; None without a readable run.json (its problems are named by
    verify_claims)."""
    path = Path(run_dir) / RUN_FILE
    if not path.is_file() or path.is_symlink():
        return None
    digest = (read_lenient(path) or {}).get("data_digest")
    return digest if isinstance(digest, str) else None


def _capped(lines: list[str], what: str) -> list[str]:
    extra = [f"{len(lines) - _MAX_LISTED} more {what}"] if len(lines) > _MAX_LISTED else []
    return lines[:_MAX_LISTED] + extra


def id_problems(samples: SampleRows, digest: str | None, where: str = "shard") -> list[str]:
    if digest is None:
        return []
    wrong = [f"{shard}: sample {sid!r} (row {row}) is stored under another sample's id: the id of row {row} is "
             f"{sample_id_for(digest, row)!r} (sha256 of {RUN_FILE}'s data_digest and the row)"
             for shard, sid, row, _ in samples.rows
             if not isinstance(row, int) or sid != sample_id_for(digest, row)]
    return _capped(wrong, f"{where} row(s) stored under another sample's id")


def order_problems(samples: SampleRows) -> list[str]:
    out, previous = [], None
    for shard, sid, row, _ in samples.rows:
        if isinstance(row, int) and previous is not None and row <= previous:
            out.append(f"{shard}: sample {sid!r} (row {row}) comes after row {previous}: a run stores its samples in "
                       "the data's order, each row once")
        previous = row if isinstance(row, int) else previous
    return _capped(out, "row(s) out of the data's order")


def length_problems(samples: SampleRows, manifest: dict[str, Any]) -> list[str]:
    config = (manifest.get("provenance") or {}).get("config") if isinstance(manifest.get("provenance"), dict) else None
    max_length = ((config or {}).get("data") or {}).get("max_length") if isinstance(config, dict) else None
    if not isinstance(max_length, int):
        return []
    long = [f"{shard}: sample {sid!r} has {n} tokens, more than data.max_length={max_length} in the provenance"
            for shard, sid, _, n in samples.rows if isinstance(n, int) and n > max_length]
    return _capped(long, "sample(s) longer than data.max_length")


def sample_problems(run_dir: Path, manifest: dict[str, Any], samples: SampleRows) -> list[str]:
    digest = data_digest(run_dir)
    if digest is None:  # not a run pipeline.extract started: its rows need not be one data file's, in order
        return length_problems(samples, manifest)
    return id_problems(samples, digest) + order_problems(samples) + length_problems(samples, manifest)
