"""Export a finished, verified run in a trainer's layout: resumable, atomic per file, memory bounded by one shard.

Order of work: read the manifest; choose the slots (slots.py; the last state is never guessed, and derived only
when asked: unnorm.py); stop if OUT already holds this export complete; verify the run (a run that does not verify is
refused); claim OUT (one export at a time) and prepare it as pipeline.core.lifecycle decides (new or resume); write
every sample's file not already there, each to a temp file renamed when complete (a killed export leaves only
`.*.tmp` files, which no trainer lists and the next run removes); the layout's own index files; `export.json` last.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import torch

from pipeline.core import lifecycle
from pipeline.core.io import atomic_path
from pipeline.core.store_dir import DEFAULT_SPOOL
from pipeline.exports import vocab
from pipeline.exports.base import Exporter, ExportSample
from pipeline.exports.progress import ExportProgress
from pipeline.exports.sidecar import build, plan_record
from pipeline.exports.slots import ExportError, RunDoesNotVerify, SlotPlan, plan_slots
from pipeline.exports.target import ExportOut, check_writable, claimed, export_files, found, on_store
from pipeline.exports.unnorm import Unnorm
from pipeline.shards.layout import check_out
from pipeline.shards.manifest import ManifestError
from pipeline.shards.reader import RunReader
from pipeline.shards.run_at import RunAt

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class ExportResult:
    out: Path | str  # a directory, or an s3:// URL
    status: lifecycle.Plan  # new | resume | complete (nothing left to do)
    plan: SlotPlan
    written: int
    skipped: int
    bytes_written: int
    seconds: float


def _manifest(run: RunAt) -> dict:
    try:
        return run.manifest()
    except ManifestError as exc:
        raise ExportError(f"not a finished run: {exc}") from None


def _verify(run: RunAt) -> None:
    problems, _ = run.verify()
    if problems:
        raise RunDoesNotVerify(f"run {run.name} does not verify ({len(problems)} problem(s), first: "
                               f"{problems[0]}); see python -m pipeline.verify {run.name}")


def _samples(reader: RunReader) -> Iterator[tuple[int, str, int]]:
    """(index, sample_id, shard) in storage order, releasing each shard's mapping once it has been read."""
    previous = None
    for index, sample_id in enumerate(reader.sample_ids):
        shard = reader.shard_of(sample_id)
        if previous is not None and shard != previous:
            reader.release(previous)
        previous = shard
        yield index, sample_id, shard


def _write_samples(reader: RunReader, exporter: Exporter, plan: SlotPlan, out: ExportOut,
                   progress: ExportProgress, unnorm: Unnorm | None) -> None:
    num_shards, previous = len(reader.entries), None
    for index, sample_id, shard in _samples(reader):
        if previous is not None and shard != previous:
            progress.shard_done(previous, num_shards)
        previous = shard
        path = exporter.sample_file(out.root, index)
        if out.has(path):  # only ever put in place complete
            progress.sample(num_tokens=len(reader.tokens(sample_id)["input_ids"]), num_bytes=0, skipped=True)
            continue
        row = reader[sample_id]
        hidden = row["hidden_states"]
        if unnorm is not None:
            hidden = unnorm.apply(hidden, plan.last_index, sample_id)
        sample = ExportSample(index=index, sample_id=sample_id, input_ids=row["input_ids"],
                              loss_mask=row["loss_mask"], hidden_TPH=hidden)
        with atomic_path(path) as tmp:  # its fault points stand in for a crash at any sample (pipeline.core.faults)
            exporter.write_sample(tmp, sample, plan)
        size = path.stat().st_size
        out.publish(path)
        progress.sample(num_tokens=sample.input_ids.shape[0], num_bytes=size, skipped=False)
    if previous is not None:
        progress.shard_done(previous, num_shards)


def _derive_first(reader: RunReader, plan: SlotPlan, unnorm: Unnorm) -> None:
    """A reference export's derived last slot is made on every read: one sample is derived now, so that a run whose
    final_norm is not its checkpoint's norm is refused by the export rather than at the trainer's first batch."""
    for _, sample_id, _ in _samples(reader):
        unnorm.apply(reader[sample_id]["hidden_states"], plan.last_index, sample_id)
        break
    log.info("the last slot (final_norm / the norm's weight) is derived on every read of a reference export, each "
             "sample copied beside it, which a full export does once: where the trainer's reads set the pace, export "
             "in full (bench/README.md one_copy)")


def _tokens(reader: RunReader) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for _, sample_id, _ in _samples(reader):
        row = reader.tokens(sample_id)
        yield row["input_ids"], row["loss_mask"]


def export_run(run_dir: Path | str, out: Path | str, exporter: Exporter, *, aux: Sequence[str] | None = None,
               last: str | None = None, verify: bool = True, draft_vocab: int | None = None,
               states: str = "copy", spool_dir: str = DEFAULT_SPOOL) -> ExportResult:
    """Export `run_dir` into `out` with `exporter`'s layout; ExportError says why a run or `out` does not fit.
    `draft_vocab` N (speculators only): also the trainer's token frequencies and d2t/t2d for the N most frequent
    trained tokens (exports/vocab.py). `states="reference"` (speculators only): no state is copied; the trainer reads
    them from the run (pipeline.exports.run_states), and the sidecar fingerprints the run's files. `run_dir` may be
    an `s3://bucket/prefix` URL (a string): the run is verified through a staged copy and read by ranges; so may
    `out`: its files are written in `spool_dir` one at a time and uploaded (pipeline.exports.target)."""
    run = RunAt(run_dir)
    manifest = _manifest(run)
    if not on_store(out):
        out = Path(out)
        check_out(out, f"--out {out}", ExportError, writable=False)  # before anything is planned or read
    plan = plan_slots(exporter.layout, run_points=manifest["points"], num_layers=_num_layers(run, manifest), aux=aux,
                      last=last)
    record = plan_record(run, manifest, exporter.layout, plan)
    _check_states(exporter, record, states)
    target_vocab = _draft_vocab(run.name, manifest, exporter.layout.name, record, draft_vocab)
    files = export_files(exporter.files, states=states, draft_vocab=draft_vocab)
    sidecar = build(run, manifest, exporter.layout, plan, record)  # before any file: it cannot fail at the end
    if states == "reference":
        sidecar["run_files"] = run.fingerprint(manifest)
    progress = ExportProgress(name=exporter.layout.name, num_samples=manifest["num_samples"],
                              num_tokens=manifest["num_tokens"])
    complete = ExportResult(out=out, status="complete", plan=plan, written=0, skipped=manifest["num_samples"],
                            bytes_written=0, seconds=0.0)
    if found(out, record, files) == "complete":  # before the full-read verification
        return complete
    unnorm = Unnorm.of_run(manifest, run.name) if plan.last_unnormed else None  # before anything is written
    check_writable(out, spool_dir)  # a path through a file, a read-only dir, a spool that cannot be written
    if verify:
        _verify(run)
    with claimed(out, record, files, spool_root=spool_dir) as target:
        if target.plan == "complete":  # what another export did meanwhile
            return complete
        target.prepare()
        index_bytes = _fill(target, run, exporter, plan, progress, unnorm, states, sidecar,
                            vocab_sizes=(draft_vocab, target_vocab))
    return _result(complete, target.plan, progress, index_bytes, states)


def _fill(target: ExportOut, run: RunAt, exporter: Exporter, plan: SlotPlan, progress: ExportProgress,
          unnorm: Unnorm | None, states: str, sidecar: dict, *, vocab_sizes: tuple[int | None, int | None]) -> int:
    """Every file of the export `target` does not hold yet, then its sidecar; the bytes of its index files."""
    draft_vocab, target_vocab = vocab_sizes
    with RunReader(run.location) as reader, progress:
        if states == "copy":
            _write_samples(reader, exporter, plan, target, progress, unnorm)
        elif unnorm is not None:
            _derive_first(reader, plan, unnorm)
        index_files = exporter.finish(target.root, _tokens(reader))
        index_bytes = sum(p.stat().st_size for p in index_files)
        target.publish(*index_files)
        if draft_vocab is not None:
            sidecar["draft_vocab"] = vocab.write(target.root, _tokens(reader), draft_vocab, target_vocab,
                                                 named=target.trainer_name)
            target.publish(*(target.root / name for name in vocab.names(draft_vocab)))
    target.finish(_finished_sidecar(sidecar, exporter, plan, target.root, progress, index_files, unnorm, states))
    return index_bytes


def _result(complete: ExportResult, status: lifecycle.Plan, progress: ExportProgress, index_bytes: int,
            states: str) -> ExportResult:
    if states == "reference":  # every sample is referenced; what was written is the index files
        return replace(complete, status=status, written=complete.skipped, skipped=0, bytes_written=index_bytes,
                       seconds=progress.elapsed)
    return replace(complete, status=status, written=progress.written, skipped=progress.skipped,
                   bytes_written=progress.bytes, seconds=progress.elapsed)


def _num_layers(run: RunAt, manifest: Mapping[str, Any]) -> int:
    num_layers = ((manifest.get("provenance") or {}).get("model") or {}).get("num_layers")
    if not isinstance(num_layers, int):
        raise ExportError(f"run {run.name}: its manifest's provenance has no model.num_layers, so bN is unknown")
    return num_layers


def _check_states(exporter: Exporter, record: dict, states: str) -> None:
    """Check --states against the layout; a reference export says so in its plan (a rerun with the other choice is
    another export)."""
    if exporter.storage is not None:
        record["export_storage"] = exporter.storage  # another storage of the same run is another export
    if states == "copy":
        return
    if states != "reference":
        raise ExportError(f"--states {states!r}: copy or reference")
    if exporter.storage is not None:
        raise ExportError(f"--states reference writes no state, so --storage {exporter.storage} has nothing to "
                          "store: the trainer reads the run's states as the run stores them")
    if exporter.layout.name != "speculators":
        raise ExportError(f"--states reference is read by speculators' trainer only (python -m "
                          f"pipeline.trainers.speculators); the {exporter.layout.name} layout needs --states copy")
    record["states"] = "reference"


def _draft_vocab(run_name: str, manifest: Mapping[str, Any], layout_name: str, record: dict,
                 draft_vocab: int | None) -> int | None:
    """Check --draft-vocab N (speculators only) and record it in the plan only when asked (the plans of exports
    without it stay as they were); the target's vocabulary size."""
    if draft_vocab is None:
        return None
    if layout_name != "speculators":
        raise ExportError(f"--draft-vocab writes speculators' vocabulary files; the {layout_name} "
                          "layout does not read them")
    target_vocab = vocab.target_vocab_size(manifest, run_name)
    vocab.check_size(draft_vocab, target_vocab)
    record["draft_vocab"] = draft_vocab
    return target_vocab


def _finished_sidecar(sidecar: dict, exporter: Exporter, plan: SlotPlan, out: Path, progress: ExportProgress,
                      index_files: Sequence[Path], unnorm: Unnorm | None, states: str) -> dict:
    """The sidecar with what the export wrote: its files and, for a derived last slot, the derivation's record."""
    if unnorm is not None:
        sidecar["last_state"] |= unnorm.record()
    if (stored := exporter.storage_record(plan)) is not None:
        sidecar["export_storage"] = stored
        log.info("export stored as %s: rounding error (rel L2) per slot %s over %d sample(s) written", stored["dtype"],
                 ", ".join(f"{k} {v:.2e}" for k, v in stored["rounding_rel_l2"].items()), stored["samples_measured"])
    if states == "reference":
        sidecar["files"] = {"num_samples": sidecar["num_samples"], "first_sample": None,
                            "index_files": [_rel(p, out) for p in index_files]}
        return sidecar
    sidecar["files"] = {"num_samples": progress.written + progress.skipped,
                        "first_sample": _rel(exporter.sample_file(out, 0), out),
                        "index_files": [_rel(p, out) for p in index_files]}
    return sidecar


def _rel(path: Path, out: Path) -> str:
    return path.relative_to(out).as_posix()
