"""One acceptance measurement: check the inputs -> doctor each draft -> render the prompts -> one plain vLLM start and
one speculative start per draft (the adapter `pipeline.engines.vllm.speculate`, in .venv-vllm) -> report files."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from pipeline.acceptance import figures as fg
from pipeline.acceptance.render import markdown
from pipeline.core.cli import UsageError
from pipeline.core.contracts import EngineSpec
from pipeline.core.io import sha256_file, write_text_atomic
from pipeline.data.mask import encode_chat
from pipeline.data.remote_code import load_tokenizer
from pipeline.drafts.examine import Request, examine
from pipeline.drafts.report import failed
from pipeline.drafts.target import gather
from pipeline.engines.process.remote import EngineWorkerError, RemoteEngine
from pipeline.engines.registry import REPO_ROOT
from pipeline.models.info import text_config
from pipeline.regen.prompts import read_prompts
from pipeline.shards.layout import run_conflict

ADAPTER = "pipeline.engines.vllm.speculate:SpeculativeVLLM"
SGLANG_REFUSAL = ("--serve sglang: SGLang 0.5.23's EAGLE-3 path calls real sgl-kernel CPU ops "
                  "(copy_all_layer_kv_cache_cpu, fill_accept_out_cache_loc_cpu, ...) that no PyPI build provides, so "
                  "it cannot start on these CPUs; serve with --serve vllm")


@dataclass(frozen=True, kw_only=True)
class Settings:
    num_speculative_tokens: int
    max_tokens: int
    temperature: float
    dtype: str
    seed: int = 0


def _target_dir(target: Path | None, run: Path | None) -> Path:
    found = gather(run=run, export=None, model_dir=target).model_dir  # TargetError: a usage error
    if found is None or not (Path(found) / "config.json").is_file():
        raise UsageError(f"--run {run}: its model directory is not here; pass --target MODEL_DIR")
    return Path(found)


def _prompts(path: Path, model_dir: Path) -> tuple[list[list[int]], int]:
    """Each record's first prompt (the messages before its first assistant turn), in the target's chat template with
    the generation prompt; (token ids, rejected records)."""
    tokenizer = load_tokenizer(str(model_dir), False)
    got = read_prompts(path, tokenizer, max_length=1 << 20, limit=None, n=1, seed=0)
    ids = []
    for c in got.conversations:
        messages = list(c.messages)
        first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))
        if first == 0:
            raise UsageError(f"--prompts {path}: row {c.row} opens with an assistant turn, no prompt before it")
        ids.append(encode_chat(tokenizer, messages[:first], True, c.tools))
    if not ids:
        raise UsageError(f"--prompts {path}: no chat record to prompt with ({len(got.rejects)} rejected)")
    return ids, len(got.rejects)


def _doctor(draft: Path, model_dir: Path, run: Path | None) -> dict[str, Any]:
    findings, _ = examine(Request(draft=draft, serve="vllm", run=run, target=model_dir))  # DraftError: usage
    return {"verdict": "MISMATCH" if failed(findings) else "OK",
            "findings": [f"{f.status} {f.check} {f.message}" for f in findings]}


def _serve(model_dir: Path, draft: Path | None, prompts: list[list[int]], s: Settings, max_len: int) -> dict:
    spec = EngineSpec(name="vllm", dtype=s.dtype, options={
        "draft": str(draft.resolve()) if draft else None, "num_speculative_tokens": s.num_speculative_tokens,
        "max_model_len": max_len})
    engine = RemoteEngine(spec, target=ADAPTER, python=str(REPO_ROOT / ".venv-vllm" / "bin" / "python"),
                          model_path=str(model_dir), points=[], num_layers=text_config(
                              json.loads((model_dir / "config.json").read_text()))["num_hidden_layers"],
                          task="generate")
    try:
        engine.start()
    except EngineWorkerError as e:
        engine.close()
        if draft is None:
            raise
        raise UsageError(f"vLLM refused draft {draft}: {' '.join(e.summary.split())}") from None
    try:
        return {"results": engine.call("measure", prompts, s.max_tokens, s.temperature, s.seed),
                "info": asdict(engine.info())}
    finally:
        engine.close()


def _per_draft(name: str, served: dict, plain: list[dict], doctor: dict) -> dict[str, Any]:
    rows = []
    for i, (r, p) in enumerate(zip(served["results"], plain)):
        counts = fg.delta(r["before"], r["after"])
        rows.append({"prompt": i, "counters_before": r["before"], "counters_after": r["after"], "counts": counts,
                     **fg.figures(counts), "output_tokens": len(r["output_ids"]), "seconds": r["seconds"],
                     "equals_plain": r["output_ids"] == p["output_ids"], "output_ids": r["output_ids"]})
    tokens, seconds = sum(r["output_tokens"] for r in rows), sum(r["seconds"] for r in rows)
    overall = fg.total([r["counts"] for r in rows])
    return {"name": name, "doctor": doctor, "overall": {"counts": overall, **fg.figures(overall)},
            "tokens_per_s": fg.rate(tokens, seconds), "differing": sum(not r["equals_plain"] for r in rows),
            "differing_share": sum(not r["equals_plain"] for r in rows) / len(rows), "prompts": rows,
            "speculative_config": served["info"]["extra"]["speculative_config"]}


def _check_out(out: Path) -> None:
    if (why := run_conflict(out, itself=True)) is not None:
        raise UsageError(f"--out {out}: {why}")


def measure(drafts: Sequence[Path], *, target: Path | None, run: Path | None, prompts: Path, out: Path,
            settings: Settings) -> dict[str, Any]:
    _check_out(out)
    model_dir = _target_dir(target, run)
    doctors = [_doctor(d, model_dir, run) for d in drafts]  # every draft read before any engine starts
    ids, rejected = _prompts(prompts, model_dir)
    max_len = max(map(len, ids)) + settings.max_tokens + settings.num_speculative_tokens + 1
    served = [_serve(model_dir, d, ids, settings, max_len) for d in drafts]  # a draft vLLM refuses: refused early
    plain = _serve(model_dir, None, ids, settings, max_len)
    plain_rows = plain["results"]
    names = [d.name if [x.name for x in drafts].count(d.name) == 1 else str(d) for d in drafts]
    per_draft = [_per_draft(n, s, plain_rows, doc) for n, s, doc in zip(names, served, doctors)]
    report = {
        "settings": asdict(settings), "num_prompts": len(ids), "rejected_records": rejected,
        "plain": {"tokens_per_s": fg.rate(sum(len(r["output_ids"]) for r in plain_rows),
                                          sum(r["seconds"] for r in plain_rows)),
                  "prompts": [{"output_ids": r["output_ids"], "seconds": r["seconds"]} for r in plain_rows]},
        "drafts": per_draft,
        "provenance": {"vllm_version": plain["info"]["framework_version"],
                       "target": {"path": str(model_dir), "config_sha256": sha256_file(model_dir / "config.json")},
                       "prompts": {"path": str(prompts), "sha256": sha256_file(prompts),
                                   "prompt_ids": ids},
                       "drafts": [{"path": str(d), "files": {f.name: sha256_file(f) for f in sorted(d.iterdir())
                                                             if f.is_file()}} for d in drafts],
                       "environment": plain["info"]["extra"]}}
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "report.json", json.dumps(report, indent=1) + "\n")
    write_text_atomic(out / "report.md", markdown(report))
    return report
