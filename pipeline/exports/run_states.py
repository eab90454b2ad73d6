"""A reference export's states, read from the run itself: sample i as speculators' trainer takes it, checked on arrival.

`python -m pipeline.export RUN --format speculators --states reference` copies no state. Its export.json names the run
(its path or `s3://` URL, manifest sha256, attestation digest, and the size and mtime, or an object's size and ETag, of
every file the manifest lists: `run_files`) and the slot plan; the trainer reads each sample's states from the run's shards through `RunStates` (the backend in
pipeline/trainers/ wraps it for speculators). A run moved, replaced or edited after the export is refused when the
trainer starts, in one line naming what changed; `check(key=PUB)` also proves the run as `pipeline.verify --key` does
(every file hashed: a full read). A file edited in place that kept its size and mtime is caught only by that full
check, as by `pipeline.verify`. A run in a bucket is read from it directly (`RunReader`'s ranged reads: a training node
needs no copy of the run).

On arrival `sample(i)` checks what speculators' cached path does not (it checks token equality only, and turns a
mismatch into a silently skipped sample): the shape, finite values, and token ids equal to the export's dataset row.
Each failure raises `RunStatesError` naming the sample and the shard file; nothing is skipped. One shard is mapped at
a time per process (a trainer's data loader worker), so resident memory stays bounded whatever the run's size.
"""
from __future__ import annotations

import bisect
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pyarrow as pa
import torch

from pipeline.core.jsonfile import read_object
from pipeline.exports.slots import ExportError
from pipeline.exports.speculators import ARROW_FILE
from pipeline.exports.unnorm import Unnorm
from pipeline.shards import layout as shard_layout
from pipeline.shards.reader import RunReader
from pipeline.shards.run_at import RunAt
from pipeline.shards.signing_keys import load_public_key
from pipeline.shards.validate import all_finite

SIDECAR = "export.json"  # pipeline.exports.sidecar.SIDECAR (imported there from here would be a cycle)


class RunStatesError(ExportError):
    """A reference export whose run is not the one it was made from, or a sample that fails a check on arrival."""


class RunStates:
    """Sample i of a reference export, from its run. Picklable before and after use (data loader workers)."""

    def __init__(self, export_dir: str | Path) -> None:
        self.export_dir = Path(export_dir)
        self._reader: RunReader | None = None
        self._ids: list[str] = []
        self._table: pa.Table | None = None
        self._shard: int | None = None
        self.unnorm: Unnorm | None = None  # a derived last slot's, once `check` has matched its weight to the export
        self.sidecar: dict[str, Any] | None = None  # once `check` has passed in this process

    def __getstate__(self) -> dict[str, Any]:
        return {"export_dir": self.export_dir}  # a worker opens its own mappings

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["export_dir"])

    # -- at the trainer's start -------------------------------------------------------------------------------------

    def check(self, key: str | Path | None = None) -> dict[str, Any]:
        """The export's sidecar, once the run it names is proven to be the one it was made from (one line naming
        what changed otherwise). With `key` (the signer's Ed25519 public key, PEM) every file of the run is also
        hashed and the attestation's signature checked, as `pipeline.verify --key` does."""
        sidecar = read_object(self.export_dir / SIDECAR, RunStatesError)
        if sidecar.get("states") != "reference":
            raise RunStatesError(f"{self.export_dir}: not a reference export (export.json has no states: reference); "
                                 "its states are in its own files: train it with speculators' file backend")
        run = RunAt(sidecar["run_dir"])  # a path, or the run's s3:// URL (read from the bucket)
        if not run.has_manifest():
            raise RunStatesError(f"{self.export_dir}: its run {run.name} is gone (moved or removed: no "
                                 f"{shard_layout.MANIFEST_NAME}); export the run again from where it is now")
        manifest_at = run.where(shard_layout.MANIFEST_NAME)
        if run.manifest_sha256() != sidecar["run_manifest_sha256"]:
            raise RunStatesError(f"{manifest_at} is not the manifest {self.export_dir} was exported from (another "
                                 "run at that path, or the run was rewritten); export it again")
        if run.attestation() != sidecar["run_attestation"]:
            raise RunStatesError(f"{run.where(shard_layout.ATTESTATION_NAME)} changed since {self.export_dir} was "
                                 "exported; verify the run and export it again")
        for rel, why, found in run.changes(sidecar["run_files"])[:1]:
            self._refuse_changed(run, rel, why, found, sidecar["run_files"][rel])
        if sidecar["last_state"].get("derived"):
            self.unnorm = self._checked_norm(run, sidecar["last_state"])
        if key is not None:
            self._prove(run, key)
        self.sidecar = sidecar
        return sidecar

    def _refuse_changed(self, run: RunAt, rel: str, why: str, found: Mapping[str, Any] | None,
                        want: Mapping[str, Any]) -> None:
        path = run.where(rel)
        if why == "missing":
            raise RunStatesError(f"{path} is missing: the run changed since {self.export_dir} was exported")
        if why == "resized":
            raise RunStatesError(f"{path} is {(found or {}).get('bytes')} bytes, {want['bytes']} when "
                                 f"{self.export_dir} was exported: the run changed (python -m pipeline.verify "
                                 f"{run.name})")
        raise RunStatesError(f"{path} was modified after {self.export_dir} was exported: the run changed "
                             f"(python -m pipeline.verify {run.name})")

    def _checked_norm(self, run: RunAt, last_state: Mapping[str, Any]) -> Unnorm:
        """A derived last slot divides by the checkpoint's final-norm weight: the one the export was made with (the
        checkpoint at the run's model path may have been replaced since)."""
        try:
            unnorm = Unnorm.of_run(run.manifest(), run.name)
        except ExportError as exc:
            raise RunStatesError(f"{self.export_dir}: {exc}") from None
        if unnorm.digest != last_state.get("norm_weight_float32_sha256"):
            raise RunStatesError(f"{unnorm.where} is not the final-norm weight {self.export_dir} was exported with "
                                 "(the checkpoint at the run's model path changed); export the run again")
        return unnorm

    @staticmethod
    def _prove(run: RunAt, key: str | Path) -> None:
        public = load_public_key(key)
        problems, _ = run.verify(key=public)
        if problems:
            raise RunStatesError(f"run {run.name} is not proven by {key} ({len(problems)} problem(s), first: "
                                 f"{problems[0]})")

    # -- per sample ---------------------------------------------------------------------------------------------------

    def _open(self) -> RunReader:
        if self._reader is None:
            # the trainer's start check when it ran in this process; a worker (unpickled) makes the cheap one itself
            # (the key's full check ran at the trainer's start)
            sidecar = self.sidecar if self.sidecar is not None else self.check()
            indices = [s["run_point_index"] for s in sidecar["slots"]]
            self.indices = torch.tensor(indices, dtype=torch.long)
            # only the run's points from the first slot's to the last slot's are read; the slots within them picked
            self.span = slice(min(indices), max(indices) + 1)
            self.within = None if indices == list(range(min(indices), max(indices) + 1)) else \
                torch.tensor([i - min(indices) for i in indices], dtype=torch.long)
            run = RunAt(sidecar["run_dir"])
            self._reader = RunReader(run.location)  # a derived slot's Unnorm came with the check above
            self._ids = self._reader.sample_ids
            with pa.memory_map(str(self.export_dir / ARROW_FILE)) as source:
                self._table = pa.ipc.open_stream(source).read_all()  # zero-copy over the mapping
            self._rows = _row_index(self._table.column("input_ids"))
        return self._reader

    def __len__(self) -> int:
        self._open()
        return len(self._ids)

    def sample(self, index: int) -> dict[str, torch.Tensor]:
        """{"hidden_states": [T, K+1, H] in the capture dtype (fp8 storage dequantized), "token_ids": [T] int64}."""
        reader = self._open()
        if not 0 <= index < len(self._ids):
            raise RunStatesError(f"{self.export_dir}: sample {index} asked, the run has {len(self._ids)}")
        sample_id = self._ids[index]
        shard = reader.shard_of(sample_id)
        if self._shard is not None and shard != self._shard:
            reader.release(self._shard)  # one shard mapped at a time
        self._shard = shard
        states = reader.hidden_states(sample_id, self.span)
        if self.within is not None:
            states = states.index_select(1, self.within)
        if self.unnorm is not None:  # the last slot is final_norm, divided by the norm's weight
            try:
                states = self.unnorm.apply(states, states.shape[1] - 1, sample_id)
            except ExportError as exc:
                raise RunStatesError(f"{self._where(index)}: {exc}") from None
        ids = reader.tokens(sample_id)["input_ids"].to(torch.int64)
        self._check(index, states, ids)
        return {"hidden_states": states, "token_ids": ids}

    def _where(self, index: int) -> str:
        """Sample `index` and the shard file it is read from, for a failure's message."""
        sample_id = self._ids[index]
        return f"sample {index} ({sample_id}) in {self._reader.tensor_file(self._reader.shard_of(sample_id))}"

    def _check(self, index: int, states: torch.Tensor, ids: torch.Tensor) -> None:
        expected = self._rows(index)  # a view of the mapped dataset
        shape = (len(expected), len(self.indices), int(self.sidecar["hidden_size"]))
        if tuple(states.shape) != shape:
            raise RunStatesError(f"{self._where(index)}: hidden states {tuple(states.shape)}, expected {shape} "
                                 "(tokens, slots, hidden size)")
        if not np.array_equal(ids.numpy(), expected):  # same length: the shape check above
            first = int(np.flatnonzero(ids.numpy() != expected)[0])
            raise RunStatesError(f"{self._where(index)}: token ids differ from the export's dataset row {index} (first "
                                 f"at token {first}): the run is not the one the export was made from")
        if not all_finite(states):
            finite = torch.isfinite(states)
            token, slot = (int(v) for v in (~finite).nonzero()[0][:2])
            raise RunStatesError(f"{self._where(index)}: {int((~finite).sum())} non-finite value(s), first at token "
                                 f"{token}, slot {slot} ({self.sidecar['slots'][slot]['point']})")


def _row_index(column: pa.ChunkedArray):
    """row -> that row's values, a zero-copy numpy view of the mapped list column (a row's own pyarrow scalar costs
    tens of microseconds, a trainer's whole sample read at SmolLM2's size is a millisecond)."""
    starts, parts = [0], []
    for chunk in column.chunks:
        parts.append((chunk.offsets.to_numpy(), chunk.values.to_numpy()))
        starts.append(starts[-1] + len(chunk))

    def row(index: int) -> np.ndarray:
        at = bisect.bisect_right(starts, index) - 1
        offsets, values = parts[at]
        i = index - starts[at]
        return values[offsets[i]:offsets[i + 1]]
    return row
