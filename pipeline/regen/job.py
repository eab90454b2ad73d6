"""The regeneration job: check -> read prompts -> claim the directory -> regenerate units (resumable) -> manifest,
written last.

The directory goes through the same lifecycle as a run (pipeline.core.lifecycle): one writer (its lock and lease), a
start record a rerun must match to resume, units finished by an earlier invocation checked and skipped, a replacement
only with overwrite=true. A finished regeneration is days of a cluster's time: nothing here deletes one otherwise.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, ContextManager, Union

from omegaconf import DictConfig

from pipeline import provenance
from pipeline.config import ConfigError, RegenerateConfig, resolved_dict, to_config
from pipeline.config.checks import check_data_path, resolve_model
from pipeline.config.location import checked_locations
from pipeline.core import lifecycle, store_dir
from pipeline.core.storage import SCHEME
from pipeline.core.store_dir import checked_spool
from pipeline.core.io import sha256_json
from pipeline.core.outdir import json_text, write_json
from pipeline.data import regeneration as rd
from pipeline.data.mask import turn_ids
from pipeline.data.prepare import NoValidRecords, write_rejects
from pipeline.data.remote_code import RemoteCodeError, load_tokenizer
from pipeline.engines.registry import check_name, check_options
from pipeline.models.info import ModelInfo
from pipeline.regen.conversation import Conversation
from pipeline.regen.prompts import Prompts, read_prompts
from pipeline.regen.room import check_room
from pipeline.regen.sampling import stop_token_ids
from pipeline.regen.stage import RegenPlan, RegenResult
from pipeline.run.executor import Executor
from pipeline.run.executors import executor_for
from pipeline.run.progress import RunProgress
from pipeline.shards.layout import check_out

log = logging.getLogger(__name__)
Held = Union[lifecycle.Held, store_dir.StoreHeld]


DETERMINISM = ("greedy: the same ids on every resume and rerun on the same machine, engine and thread count; "
               "seeded sampling: each turn's seed comes from sampling.seed and the conversation id, so the same "
               "request gets the same seed whatever it is batched with; its ids repeat where the engine honours "
               "per-request seeds and computes the same logits for it (HF: one request at a time, always; vLLM: "
               "float32, or bf16 when the batch composition does not change the kernels' reduction order; SGLang "
               "0.5.23 on CPU ignores per-request seeds (it reads them only with deterministic inference, which "
               "its CPU attention backend refuses): its sampled ids depend on the batch, and each turn's applied "
               "values say seed_honoured false)")


@dataclass(frozen=True, kw_only=True)
class RegenSummary:
    out_dir: Path | str  # the regeneration directory, or its s3:// URL
    manifest: dict[str, Any]
    resumed_units: int
    seconds: float
    generate_seconds: float

    @property
    def where(self) -> str:
        """The directory as a message names it: its URL, or its absolute path."""
        return self.out_dir if isinstance(self.out_dir, str) else str(self.out_dir.resolve())


def _check(cfg: RegenerateConfig) -> tuple[RegenerateConfig, Path, ModelInfo, dict[str, Any], dict[str, str]]:
    """The config checked against the world (data.path on object storage read from its local copy from here on)."""
    try:
        check_name(cfg.engine.name)
        check_options(cfg.engine, "engine")
        sampling, origin = cfg.sampling.resolved(dict(cfg.model.sampling))
    except ValueError as e:
        raise ConfigError(str(e)) from e
    named = cfg.data.path
    cfg = checked_locations(cfg, rd.REGEN_DIR, overwrite=cfg.overwrite)
    # A regeneration directory itself is this job's to resume or (overwrite=true) replace: the lifecycle decides.
    if SCHEME.match(cfg.out_dir):  # its prefix is checked where it is claimed (pipeline.core.store_dir)
        out = checked_spool(cfg.spool_dir, cfg.out_dir, cfg.s3_endpoint)
    else:
        out = check_out(Path(cfg.out_dir), f"out_dir={cfg.out_dir!r}", ConfigError,
                        itself=not rd.is_regeneration(Path(cfg.out_dir)))
    if rd.is_regeneration(Path(cfg.data.path)):
        raise ConfigError(f"data.path={named!r} is a regeneration directory: its answers are already the "
                          f"target's; extract it (python -m pipeline.extract data.path=...), or regenerate from the "
                          f"prompt file it was made from")
    check_data_path(cfg.data)
    return cfg, out, resolve_model(cfg.model), sampling, origin


def _start_record(config: dict[str, Any], prompts: Prompts, digests: dict[str, Any]) -> dict[str, Any]:
    """What must not change between an interrupted regeneration and its resumption."""
    return {"config": provenance.stable_config(config), "data_digest": prompts.source_digest,
            "model_config_sha256": digests["config_sha256"], "weights_sha256": digests["weights"]["sha256"],
            "tokenizer_sha256": digests["tokenizer_sha256"], "chat_template_sha256": digests["chat_template_sha256"],
            "remote_code": digests["remote_code"], "code": provenance.code_version()}


def _applied_summary(results: list[RegenResult]) -> list[dict[str, Any]]:
    """The distinct sampling values the engine applied (per request: seed and token budget aside), with counts: each
    part's (its marker's `applied`), most frequent first."""
    seen: Counter[str] = Counter()
    for result in results:
        seen.update(result.counts.get("applied") or {})
    return [{"values": json.loads(k), "turns": n} for k, n in seen.most_common()]


def _manifest(cfg: RegenerateConfig, config: dict[str, Any], model: ModelInfo, digests: dict[str, Any],
              engine: dict[str, Any], prompts: Prompts, results: list[RegenResult], sampling: dict[str, Any],
              origin: dict[str, str], stop: dict[str, Any]) -> dict[str, Any]:
    counts: Counter[str] = Counter()
    ends: Counter[str] = Counter()
    for r in results:
        counts.update({k: v for k, v in r.counts.items() if isinstance(v, int)})
        ends.update(r.counts.get("end_reasons") or {})
    rejects = list(prompts.rejects) + [rej for r in results for rej in r.rejects]
    parts = []
    for r in results:
        rel = rd.part_paths(Path("."), r.index)["parquet"].as_posix()
        info = r.files[rel]
        parts.append({"file": rel, "sha256": info["sha256"], "bytes": info["bytes"],
                      "conversations": r.counts.get("conversations", 0)})
    prov = {
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "code": provenance.code_version(),
        "engine": engine,
        "model": {"path": str(model.path), "model_type": model.model_type, "architecture": model.architecture,
                  "num_layers": model.num_layers, "vocab_size": model.vocab_size, "checkpoint_dtype": model.torch_dtype,
                  "quantization_config": model.quantization, **digests},
        "data": {"source": prompts.source, "sha256": prompts.source_digest},
        "sampling": {"values": sampling, "from": origin, "seed": cfg.sampling.seed, "n": cfg.sampling.n,
                     "stop_token_ids": stop, "truncated": str(cfg.sampling.truncated),
                     "seeds": "per conversation: sha256(sampling.seed:conversation_id); per turn: + the turn index",
                     "applied": _applied_summary(results), "determinism": DETERMINISM},
        "config": config,
    }
    stable = {k: v for k, v in prov.items() if k != "created_utc"}
    stable["config"] = provenance.stable_config(config)
    return {
        "kind": rd.KIND, "format_version": rd.REGEN_FORMAT_VERSION,
        "num_records": prompts.num_records, "num_conversations": counts["conversations"],
        "num_turns": counts["turns"], "prompt_tokens": counts["prompt_tokens"],
        "generated_tokens": counts["generated_tokens"],
        "truncated": {"turns": counts["truncated"], "kept": counts["truncated_turns"],
                      "policy": str(cfg.sampling.truncated)},
        "end_reasons": dict(ends),
        "parts": parts,
        "rejects": {"total": len(rejects), "by_reason": dict(Counter(r.reason for r in rejects)),
                    "files": [rd.REJECTS, f"{rd.RECORDS_DIR}/*.rejects.parquet"]},
        "provenance": prov,
        "provenance_digest": sha256_json(stable),
    }


def run_regenerate(dcfg: DictConfig) -> RegenSummary:
    started = time.perf_counter()
    cfg = to_config(dcfg, RegenerateConfig)
    cfg, out, model, sampling, origin = _check(cfg)  # every config error surfaces here, before any model loads
    config = resolved_dict(dcfg)
    tokenizer, stop_ids, stop = _tokenizer(cfg, model)
    try:
        prompts = read_prompts(cfg.data.path, tokenizer, max_length=cfg.data.max_length, limit=cfg.data.limit,
                               n=cfg.sampling.n, seed=cfg.sampling.seed)
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"data.path={dcfg.data.path!r}: {e}" if "model.path" not in str(e) else str(e)) from e
    log.info("%d conversations to regenerate from %d records of %s; %d rejected", len(prompts.conversations),
             prompts.num_records, prompts.source, len(prompts.rejects))
    units = _units(prompts, cfg.runner.max_samples_per_shard)
    if cfg.check_space and not SCHEME.match(cfg.out_dir):  # on a store the spool holds a part or two, a few MB
        log.info("%s", check_room(out, units, max_length=cfg.data.max_length, overwrite=cfg.overwrite))
    digests = provenance.model_digests(model, getattr(tokenizer, "chat_template", None), cfg.model.trust_remote_code)
    record = _start_record(config, prompts, digests)
    executor = executor_for(cfg.runner, cfg.engine, model_path=str(model.path), points=[],
                            num_layers=model.num_layers, trust_remote_code=cfg.model.trust_remote_code, task="generate")
    executor.expect(longest=cfg.data.max_length)  # prompt and answer together
    with _held(cfg, out, record) as held:
        if not prompts.conversations:
            raise _nothing_to_regenerate(dcfg, prompts)
        with executor:
            engine = _engine_record(executor)
            held.prepare()
            write_rejects(out / rd.REJECTS, prompts.rejects)
            stage = RegenPlan(model_path=str(model.path), trust_remote_code=cfg.model.trust_remote_code,
                              sampling=sampling, stop_ids=stop_ids, max_length=cfg.data.max_length,
                              keep_truncated=cfg.sampling.truncated == "keep", lease_token=held.token,
                              target=held.target)
            generate_started = time.perf_counter()
            results = executor.run(stage, out, units, progress=RunProgress(units, "regenerate", produced=True))
            generate_seconds = time.perf_counter() - generate_started
        manifest = _manifest(cfg, config, model, digests, engine, prompts, results, sampling, origin, stop)
        if not manifest["num_conversations"]:  # never finished: extract would refuse it
            raise _nothing_to_regenerate(dcfg, prompts, manifest)
        held.finish(lambda: _finish(held, manifest))
    return RegenSummary(out_dir=cfg.out_dir if held.target is not None else out, manifest=manifest,
                        resumed_units=sum(r.skipped for r in results), seconds=time.perf_counter() - started,
                        generate_seconds=generate_seconds)


def _tokenizer(cfg: RegenerateConfig, model: ModelInfo) -> tuple[Any, tuple[int, ...], dict[str, Any]]:
    """The checkpoint's tokenizer, and the ids that end a turn (with their record); config errors naming why."""
    try:
        tokenizer = load_tokenizer(model.path, cfg.model.trust_remote_code)
    except RemoteCodeError as e:
        raise ConfigError(str(e)) from e
    try:  # its errors name model.path or sampling.stop_token_ids themselves
        return tokenizer, *stop_token_ids(model.path, tokenizer, turn_ids(tokenizer), cfg.sampling.stop_token_ids)
    except ValueError as e:
        raise ConfigError(str(e)) from e


def _held(cfg: RegenerateConfig, out: Path, record: dict[str, Any]) -> ContextManager[Held]:
    """The regeneration directory claimed for this job: on disk, or on object storage through its local spool."""
    return store_dir.held_at(cfg.out_dir, out, record, kind=rd.REGEN_DIR, spool_root=cfg.spool_dir,
                             wait=cfg.wait_for_lock, overwrite=cfg.overwrite, endpoint=cfg.s3_endpoint)


def _finish(held: Held, manifest: dict[str, Any]) -> None:
    """The manifest, written last: on object storage after the records that could not be regenerated, create-only."""
    if held.target is None:
        write_json(held.out / rd.MANIFEST, manifest)
        return
    held.target.put_file(held.out, rd.REJECTS)
    held.complete(json_text(manifest).encode())


def _units(prompts: Prompts, size: int) -> list[list[Conversation]]:
    return [prompts.conversations[i:i + size] for i in range(0, len(prompts.conversations), size)]


def _nothing_to_regenerate(cfg: DictConfig, prompts: Prompts, manifest: dict | None = None) -> NoValidRecords:
    """No record read could be regenerated (manifest None: before any engine started), or none gave a conversation
    (the parts' rejects say why; the directory stays unfinished)."""
    rejects = (manifest or {}).get("rejects") or {"total": len(prompts.rejects),
                                                   "by_reason": Counter(r.reason for r in prompts.rejects)}
    reasons = ", ".join(f"{k}: {v}" for k, v in Counter(rejects["by_reason"]).most_common())
    where = "nothing was written" if manifest is None else \
        f"their reasons are in {str(cfg.out_dir).rstrip('/')}/{rd.RECORDS_DIR}/*.rejects.parquet; the directory is " \
        f"not finished"
    return NoValidRecords(f"no record of {cfg.data.path} can be regenerated: {rejects['total']} rejected "
                          f"({reasons or 'the file holds no record'}); {where}")


def _engine_record(executor: Executor) -> dict[str, Any]:
    info = dataclasses.asdict(executor.info())  # a copy already
    info.pop("points", None)
    return info
