"""Random access to a finished run by sample id, reading only that sample's rows, on disk or in a bucket (`s3://`).

The id -> (shard, offset, length) index comes from the small Parquet files; tensors come from the safetensors files
through `safe_open(..., framework="pt")` + `get_slice`, which memory-maps the file and copies out only the rows
asked for, so reading one sample never reads a whole shard. Hidden states come back in the dtype the engine captured
them in: fp8-stored states are dequantized with their scales (pipeline/shards/storage.py) unless `decode=False`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.parquet as pq
from safetensors import safe_open

from pipeline.core.jsonfile import parse
from pipeline.core.storage import in_order
from pipeline.core.stores import store_of
from pipeline.shards import layout
from pipeline.shards.manifest import read_manifest
from pipeline.shards.ranged import RangedShard
from pipeline.shards.formats import shard_storage
from pipeline.shards.storage import of_manifest
from pipeline.shards.writer import ShardEntry


@dataclass(frozen=True, kw_only=True)
class _Location:
    shard: int  # position in the manifest's shard list
    offset: int
    num_tokens: int


def _file_of(entry: ShardEntry, suffix: str) -> str:
    matches = [rel for rel in entry.files if rel.endswith(suffix)]
    if len(matches) != 1:
        raise ValueError(f"shard {entry.name}: expected one {suffix} file, manifest lists {sorted(entry.files)}")
    return matches[0]


class RunReader:
    """Read samples of a finished run directory. Use as a context manager, or call `close()`."""

    def __init__(self, run_dir: Path | str, *, decode: bool = True) -> None:
        """decode=False: hidden states as stored (fp8 states then come with their `hidden_scales` [T, P]).
        `run_dir` may be an `s3://bucket/prefix` URL (a string): samples are then read by ranges, a sample at a
        time (pipeline/shards/ranged.py)."""
        self.store = store_of(run_dir)
        self.run_dir = run_dir if self.store is not None else Path(run_dir)
        self.manifest = read_manifest(self.run_dir, store=self.store)
        self.points: list[str] = list(self.manifest["points"])
        self.storage = of_manifest(self.manifest)
        self.decode = decode
        self.entries = [ShardEntry.from_dict(e) for e in self.manifest["shards"]]
        self._tensor_keys = [_file_of(e, layout.SHARD_SUFFIXES["safetensors"]) for e in self.entries]
        self._index: dict[str, _Location] = {}
        parquets = [_file_of(entry, layout.SHARD_SUFFIXES["parquet"]) for entry in self.entries]
        # in a bucket a round trip each, and every data loader worker of a trainer opens its own reader (10,000
        # shards 20 ms away: 200 s one at a time)
        for shard, (parquet, table) in enumerate(zip(parquets, in_order(self._read_index, parquets))):
            self._index_shard(shard, parquet, table)
        self._handles: dict[int, Any] = {}

    def _read_index(self, parquet: str) -> dict[str, list]:
        source = pa.BufferReader(self.store.get(parquet)) if self.store is not None else self.run_dir / parquet
        return pq.read_table(source, columns=["sample_id", "offset", "num_tokens"]).to_pydict()

    def _index_shard(self, shard: int, parquet: str, table: dict[str, list]) -> None:
        for sample_id, offset, num_tokens in zip(table["sample_id"], table["offset"], table["num_tokens"]):
            if sample_id in self._index:
                raise ValueError(f"sample_id {sample_id!r} appears twice (second time in {Path(parquet).name})")
            self._index[sample_id] = _Location(shard=shard, offset=offset, num_tokens=num_tokens)

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, sample_id: object) -> bool:
        return sample_id in self._index

    @property
    def sample_ids(self) -> list[str]:
        """All sample ids in storage order (shard by shard, then by offset)."""
        return list(self._index)

    def _handle(self, shard: int) -> Any:
        if shard not in self._handles:
            key, name = self._tensor_keys[shard], Path(self._tensor_keys[shard]).name
            if self.store is not None:
                handle = RangedShard(self.store, key, self.entries[shard].files[key]["bytes"])
            else:
                handle = safe_open(str(self.run_dir / key), framework="pt")
            stored = parse(handle.metadata()[layout.META_POINTS], ValueError,
                           where=f"{name}: metadata {layout.META_POINTS}")
            if stored != self.points:
                raise ValueError(f"{name}: points {stored} != manifest {self.points}")
            found = shard_storage(handle.metadata().get(layout.META_STORAGE), self.manifest["format_version"],
                                  self.storage)
            if found != self.storage:
                raise ValueError(f"{name}: storage {found} != manifest {self.storage}")
            self._handles[shard] = handle
        return self._handles[shard]

    def _location(self, sample_id: str) -> _Location:
        try:
            return self._index[sample_id]
        except KeyError:
            raise KeyError(f"sample_id {sample_id!r} is not in run {self.run_dir}") from None

    def __getitem__(self, sample_id: str) -> dict[str, Any]:
        """{"sample_id", "hidden_states" [T, P, H] (the capture dtype), "input_ids" [T] int64, "loss_mask" [T] uint8};
        with decode=False the stored hidden states, and fp8 storage's "hidden_scales" [T, P] float32."""
        loc = self._location(sample_id)
        handle = self._handle(loc.shard)
        rows = slice(loc.offset, loc.offset + loc.num_tokens)
        stored = handle.get_slice(layout.HIDDEN_STATES)[rows]
        scales = handle.get_slice(layout.HIDDEN_SCALES)[rows] if self.storage.scaled else None
        out = {"sample_id": sample_id,
               "hidden_states": self.storage.decode(stored, scales) if self.decode else stored,
               "input_ids": handle.get_slice(layout.INPUT_IDS)[rows],
               "loss_mask": handle.get_slice(layout.LOSS_MASK)[rows]}
        if scales is not None and not self.decode:
            out["hidden_scales"] = scales
        return out

    def hidden_states(self, sample_id: str, points: slice) -> Any:
        """[T, P', H] of one sample in the capture dtype, reading only the points in `points` (a step-1 slice of the
        run's points): a trainer's slots without the points it does not read."""
        loc = self._location(sample_id)
        handle = self._handle(loc.shard)
        rows = slice(loc.offset, loc.offset + loc.num_tokens)
        stored = handle.get_slice(layout.HIDDEN_STATES)[rows, points]
        scales = handle.get_slice(layout.HIDDEN_SCALES)[rows, points] if self.storage.scaled else None
        return self.storage.decode(stored, scales)

    def tokens(self, sample_id: str) -> dict[str, Any]:
        """{"input_ids" [T] int64, "loss_mask" [T] uint8} of one sample, without touching its hidden states."""
        loc = self._location(sample_id)
        handle, rows = self._handle(loc.shard), slice(loc.offset, loc.offset + loc.num_tokens)
        return {"input_ids": handle.get_slice(layout.INPUT_IDS)[rows],
                "loss_mask": handle.get_slice(layout.LOSS_MASK)[rows]}

    def shard_of(self, sample_id: str) -> int:
        """Position in the manifest's shard list of the shard holding `sample_id`."""
        return self._location(sample_id).shard

    def tensor_file(self, shard: int) -> Path | str:
        """The safetensors file of one shard (position in the manifest's shard list): its path, or its object's URL
        for a run on object storage (read by ranges, never as a file)."""
        if self.store is not None:
            return f"{self.store.url}/{self._tensor_keys[shard]}"
        return self.run_dir / self._tensor_keys[shard]

    def release(self, shard: int) -> None:
        """Unmap one shard's file (it is mapped again when next read)."""
        self._handles.pop(shard, None)

    def iter_samples(self) -> Iterator[dict[str, Any]]:
        """Every sample in storage order, one at a time; each shard is unmapped once it has been read."""
        previous = None
        for sample_id, loc in self._index.items():
            if previous is not None and loc.shard != previous:
                self.release(previous)  # keep one shard mapped, so resident pages stay bounded
            previous = loc.shard
            yield self[sample_id]

    def close(self) -> None:
        # Dropping the handles unmaps the files (safe_open has no explicit close outside a `with`).
        self._handles.clear()

    def __enter__(self) -> "RunReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
