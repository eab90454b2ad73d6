"""What a run will write, known from the prepared data before any engine starts, against the free space where it goes.

Per token: the hidden states (points x width x the stored dtype; fp8 adds a float32 scale per point), its id (int64)
and its loss-mask byte. Per sample and per shard, what the Parquet rows, the safetensors headers, the markers and
the manifest's entries add, measured on the tiny Llama (75 samples in 5 shards at width 256: 2571.06 bytes per token
on disk against 2560 of states) and rounded up. At Kimi's width the states are all but every byte.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from pipeline.shards.layout import HIDDEN_DTYPES, SHARDS_DIR, shard_paths
from pipeline.shards.storage import SCALE_DTYPE, itemsize

TOKEN_EXTRA = 8 + 1  # input_ids int64, loss_mask uint8
SAMPLE_EXTRA = 8 + 384  # its offset; its Parquet row (ids, digests, counts)
SHARD_EXTRA = 8 << 10  # safetensors header, Parquet footer, .done.json, the manifest's and attestation's entries
RUN_EXTRA = 256 << 10  # run.json, manifest, attestation, rejects, the gate's report


@dataclass(frozen=True, kw_only=True)
class Capacity:
    tokens: int  # of the whole run
    samples: int
    shards: int
    tokens_left: int  # in the shards not finished yet
    shards_left: int
    state_bytes_per_token: int  # hidden states (and scales) as stored
    bytes_left: int  # what the unfinished shards will take on disk
    free_bytes: int | None  # on out_dir's file system (the nearest existing directory's), None when unknown
    # A run on object storage: what its spool holds at most at once (the largest units, one per writer on the node),
    # the figure `free_bytes` (the spool's) is checked against; None: out_dir is the run, it holds every byte
    in_flight_bytes: int | None = None

    @property
    def bytes_total(self) -> int:
        return _bytes(self.tokens, self.samples, self.shards, self.state_bytes_per_token)

    @property
    def bytes_needed(self) -> int:
        """What the local file system must hold: the run's bytes left, or a run on object storage's units in flight."""
        return self.bytes_left if self.in_flight_bytes is None else self.in_flight_bytes

    @property
    def fits(self) -> bool:
        return self.free_bytes is None or self.bytes_needed <= self.free_bytes


def state_bytes_per_token(num_points: int, hidden_size: int, capture_dtype: str, storage_dtype: str | None) -> int:
    stored = storage_dtype or capture_dtype
    row = hidden_size * itemsize(HIDDEN_DTYPES[stored][0])
    return num_points * (row + (itemsize(SCALE_DTYPE) if storage_dtype else 0))


def _bytes(tokens: int, samples: int, shards: int, per_token: int) -> int:
    return tokens * (per_token + TOKEN_EXTRA) + samples * SAMPLE_EXTRA + shards * SHARD_EXTRA + RUN_EXTRA


def plan(units: Sequence[Sequence[int]], out_dir: Path, *, per_token: int, replacing: bool,
         finished: Callable[[int], bool] | None = None, writers: int | None = None) -> Capacity:
    """`units`: each shard's samples' token counts. A shard whose marker is there is finished (a resume writes the
    rest); `replacing` (overwrite): every shard is written again and what the run holds now is freed first. A run on
    object storage (`writers`: the units its spool `out_dir` holds at once; `finished`: whether the store holds unit
    i's marker) needs room on the local disk for the largest units in flight only."""
    finished = finished or (lambda i: shard_paths(out_dir, i)["marker"].exists())
    left = [i for i in range(len(units)) if replacing or not finished(i)]
    tokens_left = sum(sum(units[i]) for i in left)
    samples_left = sum(len(units[i]) for i in left)
    free = free_bytes(out_dir, freed=out_dir / SHARDS_DIR if replacing and writers is None else None)
    largest = sorted((_bytes(sum(units[i]), len(units[i]), 1, per_token) - RUN_EXTRA for i in left), reverse=True)
    return Capacity(tokens=sum(map(sum, units)), samples=sum(map(len, units)), shards=len(units),
                    tokens_left=tokens_left, shards_left=len(left), state_bytes_per_token=per_token,
                    bytes_left=_bytes(tokens_left, samples_left, len(left), per_token) if left else 0,
                    free_bytes=free, in_flight_bytes=None if writers is None else sum(largest[:writers]))


def free_bytes(out_dir: Path, *, freed: Path | None = None) -> int | None:
    """Free bytes on the file system `out_dir` will be on (it may not exist yet), with the files of the folder
    `freed` counted as free (a replacement removes them first)."""
    where = Path(out_dir).absolute()
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        return None
    if freed is not None and freed.is_dir():
        free += sum(p.stat().st_size for p in freed.iterdir() if p.is_file())
    return free


def gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"
