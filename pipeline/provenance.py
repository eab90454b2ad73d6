"""Run provenance: what produced a shard, in enough detail to prove it matches what serving will feed the drafter.

The full record goes into manifest.json; a compact copy (str -> str) into every shard's safetensors metadata.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from pipeline.core.contracts import CPU_THREADS, EngineInfo
from pipeline.core.io import sha256_file, sha256_json
from pipeline.core.outdir import read_record
from pipeline.data.remote_code import remote_code_record
from pipeline.models.built import CONVERSION
from pipeline.models.info import ModelInfo
from pipeline.points import Point

# Hashing every byte of a 600 GB checkpoint would take longer than many runs; past this size the weights digest
# covers each file's safetensors header (tensor names, dtypes, shapes, offsets) and size, and says so.
FULL_DIGEST_MAX_BYTES = 4 << 30
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                    "tiktoken.model", "chat_template.jinja")


def _safetensors_header_len(path: Path) -> int:
    with open(path, "rb") as f:
        return 8 + int.from_bytes(f.read(8), "little")


def weights_digest(model_dir: Path) -> dict[str, Any]:
    files = sorted(model_dir.glob("*.safetensors"))
    total = sum(f.stat().st_size for f in files)
    mode = "full" if total <= FULL_DIGEST_MAX_BYTES else "headers+sizes"
    per_file = {}
    for f in files:
        limit = None if mode == "full" else _safetensors_header_len(f)
        per_file[f.name] = {"sha256": sha256_file(f, limit), "bytes": f.stat().st_size}
    return {"mode": mode, "num_files": len(files), "bytes": total, "sha256": sha256_json(per_file)}


def _digest_of(paths: Iterable[Path]) -> str | None:
    found = {p.name: sha256_file(p) for p in paths if p.is_file()}
    return sha256_json(found) if found else None


def model_digests(info: ModelInfo, chat_template: str | None, trust_remote_code: bool = False) -> dict[str, Any]:
    return {
        "config_sha256": sha256_file(info.path / "config.json"),
        "weights": weights_digest(info.path),
        "tokenizer_sha256": _digest_of(info.path / n for n in _TOKENIZER_FILES),
        "chat_template_sha256": hashlib.sha256(chat_template.encode()).hexdigest() if chat_template else None,
        # model.trust_remote_code, the checkpoint's own .py files that it let run (tokenizer, config) and those the
        # checkpoint declares that it kept from running
        "remote_code": remote_code_record(info.path, trust_remote_code),
        # a model the factory converted from a registry package (model=smollm2): the package, file digests and converters
        "conversion": read_record(info.path / CONVERSION),
    }


def code_version() -> dict[str, Any]:
    root = Path(__file__).resolve().parent.parent
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None
    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": commit, "dirty": bool(status) if status is not None else None,
            "package_version": _package_version()}


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("pipeline")
    except PackageNotFoundError:
        return "unknown"


def capture_convention(points: list[Point], engine: EngineInfo) -> dict[str, Any]:
    return {
        "canonical": "boundary k = residual stream after k decoder layers (b0 = embedding output, bN = last layer "
                     "output before the final norm); final_norm = output of the final norm",
        "points": [p.label for p in points],
        "sources": [dataclasses.asdict(s) for s in engine.points],
    }


def build(*, model: ModelInfo, digests: dict[str, Any], engine: EngineInfo, points: list[Point],
          config: dict[str, Any], diff: dict[str, Any] | None,
          loss_mask: dict[str, Any] | None = None, data: dict[str, Any] | None = None) -> dict[str, Any]:
    engine_dict = dataclasses.asdict(engine)
    engine_dict.pop("points")
    return {
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": {"python": platform.python_version(), "platform": platform.platform()},
        "code": code_version(),
        "engine": engine_dict,
        "capture": capture_convention(points, engine),
        "model": {"path": str(model.path), "model_type": model.model_type, "architecture": model.architecture,
                  "num_layers": model.num_layers, "hidden_size": model.hidden_size,
                  "checkpoint_dtype": model.torch_dtype, "quantization_config": model.quantization, **digests},
        "config": config,
        # the data file by content (its name and decompressed sha256: every sample id derives from it and the row)
        "data": data,
        # how the assistant tokens were found (special_ids | generation_markers | incremental) and what counts as trained
        "loss_mask": loss_mask,
        "diff": diff,
    }


# Where a run is written and how its units are scheduled are not what produced it: an interrupted run may resume with
# other values (e.g. on a Ray cluster after a local start, or with more retries), and its shards stay one dataset
# (the Ray runner writes the same bytes as the local one; tests/integration/test_ray.py).
# Nor is the key that signs the run's attestation (a run may be signed when it finishes, whoever started it).
RUN_LOCAL_CONFIG_KEYS = ("out_dir", "s3_endpoint", "spool_dir", "overwrite", "wait_for_lock", "sign_key", "runner.name",
                         "runner.address",
                         "runner.num_replicas", "runner.cpus_per_replica", "runner.gpus_per_replica",
                         "runner.max_retries", "runner.overlap_writes")


def stable_config(config: dict[str, Any]) -> dict[str, Any]:
    """`config` without RUN_LOCAL_CONFIG_KEYS (dotted paths)."""
    stable = copy.deepcopy(config)
    for key in RUN_LOCAL_CONFIG_KEYS:
        *parents, leaf = key.split(".")
        node = stable
        for parent in parents:
            node = node.get(parent) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    return stable


def digest(provenance: dict[str, Any]) -> str:
    """Identity of a run's provenance, without what changes from one invocation or location to the next."""
    stable = {k: v for k, v in provenance.items() if k not in {"created_utc", "host"}}
    stable["config"] = stable_config(stable.get("config") or {})
    return sha256_json(stable)


def _compact_remote_code(record: dict[str, Any] | None) -> dict[str, Any]:
    if record is None:  # a manifest from before model.trust_remote_code existed
        return {}
    short = {"trust_remote_code": record["trust_remote_code"],
             "remote_code_sha256": sha256_json(record["files_sha256"])}
    if record.get("not_run_sha256"):  # declared by the checkpoint, kept from running by the setting
        short["remote_code_not_run_sha256"] = sha256_json(record["not_run_sha256"])
    return short


def compact(provenance: dict[str, Any]) -> dict[str, str]:
    """The str -> str copy stored in every shard's safetensors metadata."""
    e, m, c = provenance["engine"], provenance["model"], provenance["capture"]
    return {
        "provenance_digest": digest(provenance),
        "engine": json.dumps({k: e[k] for k in ("framework", "framework_version", "dtype", "quantization",
                                               "attention_backend", "parallel")}, sort_keys=True),
        "capture": json.dumps({"points": c["points"], "sources": c["sources"]}, sort_keys=True),
        "model": json.dumps({"model_type": m["model_type"], "num_layers": m["num_layers"],
                             "config_sha256": m["config_sha256"], "weights_sha256": m["weights"]["sha256"],
                             "tokenizer_sha256": m["tokenizer_sha256"],
                             "chat_template_sha256": m["chat_template_sha256"],
                             **_compact_remote_code(m.get("remote_code"))}, sort_keys=True),
        "code": json.dumps(provenance["code"], sort_keys=True),
        "diff": json.dumps(provenance["diff"], sort_keys=True),
        **_compact_threads(e.get("extra") or {}),
    }


def _compact_threads(extra: dict[str, Any]) -> dict[str, str]:
    """The CPU threads the engine computed with, where they change the bits: a shard of a resumed run says its own
    (pipeline.run.executor warns when a resume would mix them)."""
    return {CPU_THREADS: str(extra[CPU_THREADS])} if extra.get(CPU_THREADS) is not None else {}
