"""The extract job: resolve -> prepare -> diff gate -> capture units (resumable) -> manifest, written last."""
from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ContextManager, Union

from omegaconf import DictConfig

from pipeline import provenance
from pipeline.config import ConfigError, resolved_dict, to_config
from pipeline.data.load import load_samples
from pipeline.data.prepare import NoValidRecords, PreparedData, write_rejects
from pipeline.run.answers import check_answers
from pipeline.data.remote_code import RemoteCodeError, load_tokenizer
from pipeline.run.capture import ShardResult, StageSettings
from pipeline.run.executors import executor_for
from pipeline.run.gate import DiffGate, DiffGateError, GateOutcome
from pipeline.run.plan import RunPlan, check_space, make_plan
from pipeline.run.resolve import ResolvedRun, resolve_run
from pipeline.core import lifecycle, store_dir
from pipeline.shards import attestation
from pipeline.shards.directory import RUN_DIR
from pipeline.shards.layout import (ATTESTATION_NAME, DIFF_DIR, FORMAT_VERSION, MANIFEST_NAME, PREPARE_REJECTS,
                                    REJECTS_DIR, RUN, SHARDS_DIR)
from pipeline.shards.manifest import manifest_text, write_manifest
from pipeline.shards.plan import plan_units
from pipeline.shards.storage import run_record

log = logging.getLogger(__name__)
Held = Union[lifecycle.Held, store_dir.StoreHeld]


@dataclass(frozen=True, kw_only=True)
class RunSummary:
    out_dir: Path | str  # the run directory, or the run's s3:// URL
    num_samples: int
    num_tokens: int
    num_shards: int
    num_rejects: int
    points: list[str]
    resumed_shards: int
    seconds: float
    capture_seconds: float  # units only: no engine start, no gate (what runners are compared on)
    gate: GateOutcome  # the diff gate's verdict, report directory and cost
    num_truncated: int = 0  # samples cut to data.max_length (data.length_policy=truncate) among those written
    storage: dict[str, Any] | None = None  # the manifest's storage record: dtype, rounding error, bytes per token
    rejects_by_reason: dict[str, int] | None = None  # the manifest's reject counts by reason
    regeneration: dict[str, Any] | None = None  # data from a regeneration directory: who wrote the answers
    engine: Any = None  # the capturing engine's EngineInfo

    @classmethod
    def of(cls, out_dir: Path | str, manifest: dict[str, Any], results: list[ShardResult], **timing: Any) -> "RunSummary":
        """The summary of a finished run: its manifest's figures, the units an earlier invocation finished."""
        data = (manifest["provenance"].get("data") or {})
        return cls(out_dir=out_dir, num_samples=manifest["num_samples"], num_tokens=manifest["num_tokens"],
                   num_shards=len(manifest["shards"]), num_rejects=manifest["rejects"]["total"],
                   points=manifest["points"], resumed_shards=sum(r.skipped for r in results),
                   num_truncated=manifest["num_truncated"], storage=manifest["storage"],
                   rejects_by_reason=manifest["rejects"]["by_reason"], regeneration=data.get("regeneration"),
                   **timing)


def _prepare(run: ResolvedRun) -> tuple[PreparedData, str | None]:
    try:
        tokenizer = load_tokenizer(run.model.path, run.cfg.model.trust_remote_code)
    except RemoteCodeError as e:  # declared code the setting keeps from running, and no built-in class reads it
        raise ConfigError(str(e)) from e
    data = run.cfg.data
    try:
        prepared = load_samples(run.data_path, tokenizer, data, limit=data.limit, vocab_size=run.model.vocab_size,
                                error=ConfigError)
    except (ValueError, UnicodeDecodeError) as e:  # a file that is not what its format says (e.g. malformed JSON)
        raise ConfigError(f"data.path={run.data_name!r}: {e}") from e
    log.info("prepared %d samples (%d tokens) from %s; %d rejected%s", len(prepared.samples),
             sum(s.num_tokens for s in prepared.samples), run.data_name, len(prepared.rejects),
             f" ({count_text(Counter(r.reason for r in prepared.rejects))})" if prepared.rejects else "")
    return prepared, getattr(tokenizer, "chat_template", None)


def count_text(counts: Counter | dict[str, int]) -> str:
    """`too_long: 2, malformed_json: 1`, most frequent first."""
    return ", ".join(f"{k}: {v}" for k, v in Counter(counts).most_common())


def _run_record(run: ResolvedRun, config: dict[str, Any], prepared: PreparedData,
                digests: dict[str, Any]) -> dict[str, Any]:
    """What must not change between an interrupted run and its resumption."""
    return {"config": provenance.stable_config(config), "data_digest": prepared.source_digest,
            "model_config_sha256": digests["config_sha256"], "weights_sha256": digests["weights"]["sha256"],
            "remote_code": digests["remote_code"], "code": provenance.code_version()}


def _manifest(run: ResolvedRun, prov: dict[str, Any], results: list[ShardResult],
              prepared: PreparedData) -> dict[str, Any]:
    entries = [r.entry for r in results if r.entry is not None]
    rejects = list(prepared.rejects) + [rej for r in results for rej in r.rejects]
    capture_rejected = {rej.sample_id for r in results for rej in r.rejects}
    return {
        "format_version": FORMAT_VERSION,
        "points": [p.label for p in run.points],
        "hidden_size": run.model.hidden_size,
        "dtype": entries[0].dtype if entries else None,
        "num_samples": sum(e.num_samples for e in entries),
        "num_tokens": sum(e.num_tokens for e in entries),
        "num_loss_tokens": sum(e.num_loss_tokens for e in entries),
        "num_truncated": sum(s.truncated and s.sample_id not in capture_rejected for s in prepared.samples),
        "shards": [e.to_dict() for e in entries],
        "storage": run_record([e.storage for e in entries], [p.label for p in run.points],
                              hidden_size=run.model.hidden_size, num_tokens=sum(e.num_tokens for e in entries),
                              shard_bytes=sum(f["bytes"] for e in entries for f in e.files.values())),
        "rejects": {"total": len(rejects), "by_reason": dict(Counter(r.reason for r in rejects)),
                    "files": [PREPARE_REJECTS, f"{REJECTS_DIR}/"]},
        "provenance": prov,
        "provenance_digest": provenance.digest(prov),
        "attestation": ATTESTATION_NAME,  # every file's sha256 and the provenance, signed with sign_key when given
    }


def _no_valid_records(run: ResolvedRun, prepared: PreparedData, plan: lifecycle.Plan) -> NoValidRecords:
    """The error for data without one capturable record; its rejects are written for inspection where that loses
    nothing (a new run directory)."""
    where = "nothing was written"
    if plan == "new" and run.out_url is None:
        write_rejects(run.out_dir / PREPARE_REJECTS, prepared.rejects)
        where = f"their reasons are in {run.out_dir / PREPARE_REJECTS}"
    reasons = count_text(Counter(r.reason for r in prepared.rejects))
    return NoValidRecords(f"no valid records in {run.data_name}: {len(prepared.rejects)} rejected "
                          f"({reasons or 'the file holds no record'}); {where}")


def _data_record(prepared: PreparedData) -> dict[str, Any]:
    regeneration = {"regeneration": prepared.regeneration} if prepared.regeneration else {}
    return {"source": prepared.source, "sha256": prepared.source_digest, **regeneration}


def _stage_settings(run: ResolvedRun, held: Held, prov: dict[str, Any]) -> StageSettings:
    cfg = run.cfg
    return StageSettings(points=run.points, hidden_size=run.model.hidden_size, batch_size=cfg.engine.batch_size,
                         storage_dtype=cfg.runner.storage_dtype, overlap_writes=cfg.runner.overlap_writes,
                         lease_token=held.token, target=held.target, metadata=provenance.compact(prov))


def _held(run: ResolvedRun, record: dict[str, Any]) -> ContextManager[Held]:
    """The run directory claimed for this job: on disk, or on object storage through its local spool."""
    cfg = run.cfg
    return store_dir.held_at(cfg.out_dir, run.out_dir, record, kind=RUN_DIR, spool_root=cfg.spool_dir,
                             wait=cfg.wait_for_lock, overwrite=cfg.overwrite, endpoint=cfg.s3_endpoint)


def _gate_checked(gate: DiffGate, executor: Any, held: Held) -> GateOutcome:
    """The gate's verdict. When it stops a run on object storage, its report is put there before the stop is raised
    (the report is written in the driver's spool, and a driver in a pod that goes away would take it along)."""
    try:
        return gate.check(executor)
    except DiffGateError as stop:
        if held.target is None:
            raise
        held.target.check_lease("stopped by the diff gate")
        for entry in RUN.walk(held.out):
            if entry.what == "file" and entry.folder == DIFF_DIR:
                held.target.put_file(held.out, entry.rel)
        raise DiffGateError(f"{stop}\nthe report is in {held.url}/{DIFF_DIR}/ as well") from None


def _finish(run: ResolvedRun, held: Held, manifest: dict[str, Any]) -> None:
    """The attestation over every file, then the manifest: the run is finished from then on. On object storage the
    job's own files (the prepare step's rejects, the gate's report) are published first, the manifest is written
    create-only and the spool removed."""
    text = manifest_text(manifest)
    if held.target is None:
        attestation.write(run.out_dir, manifest, text, key=run.sign_key)
        write_manifest(run.out_dir, manifest)
        return
    for entry in RUN.walk(held.out):
        if entry.what == "file" and entry.folder not in (SHARDS_DIR, REJECTS_DIR):
            held.target.put_file(held.out, entry.rel)
    store = held.target.store()
    if store.head(MANIFEST_NAME) is not None:  # before the attestation: never written over a finished run's
        raise held.taken()
    attestation.write(held.out, manifest, text, key=run.sign_key, store=store)
    held.complete(text.encode())


def run_extract(dcfg: DictConfig) -> RunSummary | RunPlan:
    started = time.perf_counter()
    cfg = to_config(dcfg)
    run = resolve_run(cfg)  # every config error surfaces here, before any model loads
    executor = executor_for(cfg.runner, cfg.engine, model_path=str(run.model.path), points=run.points,
                            num_layers=run.model.num_layers, trust_remote_code=cfg.model.trust_remote_code)
    gate = DiffGate.create(cfg, run.model, run.points, run.out_dir)  # GateOff when gate.mode=off
    config = resolved_dict(dcfg)
    prepared, chat_template = _prepare(run)
    plan = make_plan(run, prepared.samples)  # before any weight is read or engine started
    if cfg.plan:
        return plan
    if cfg.check_space:  # on object storage: the spool, for the units in flight
        check_space(plan)
    digests = provenance.model_digests(run.model, chat_template, cfg.model.trust_remote_code)
    check_answers(prepared.regeneration, digests, run.model.path)
    record = _run_record(run, config, prepared, digests)
    with _held(run, record) as held:
        if not prepared.samples:
            raise _no_valid_records(run, prepared, held.plan)
        gate.probe_references(prepared.samples, executor)  # the reference engines: started, probed, closed
        executor.expect(prepared.samples)  # engines may size their caches from the longest sample
        with executor:  # the primary starts once: the gate probes it, then it captures the run
            outcome = _gate_checked(gate, executor, held)  # may stop the run: no shard yet
            held.prepare()
            write_rejects(run.out_dir / PREPARE_REJECTS, prepared.rejects)
            units = plan_units(prepared.samples, max_tokens_per_shard=cfg.runner.max_tokens_per_shard,
                               max_samples_per_shard=cfg.runner.max_samples_per_shard)
            log.info("%s %s: %d units of at most %d tokens", held.plan, run.out_dir, len(units),
                     cfg.runner.max_tokens_per_shard)
            executor_info = executor.info()
            prov = provenance.build(model=run.model, digests=digests, engine=executor_info, points=run.points,
                                    config=config, diff=outcome.summary, loss_mask=prepared.loss_mask,
                                    data=_data_record(prepared))
            settings = _stage_settings(run, held, prov)
            capture_started = time.perf_counter()
            results = executor.run(settings, run.out_dir, units)
            capture_seconds = time.perf_counter() - capture_started
        gate.finish()  # the gate report's HTML, rendered off the capture's critical path, before it is attested
        manifest = _manifest(run, prov, results, prepared)
        held.finish(lambda: _finish(run, held, manifest))
    return RunSummary.of(run.out_url or run.out_dir, manifest, results, seconds=time.perf_counter() - started,
                         capture_seconds=capture_seconds, gate=outcome, engine=executor_info)
