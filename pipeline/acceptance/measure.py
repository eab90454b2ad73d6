"""One acceptance measurement: check the inputs -> doctor each draft -> render the prompts (`prepare`, nothing
started) -> take the report directory -> one speculative vLLM start per draft and one plain start (the adapter
`pipeline.engines.vllm.speculate`, in .venv-vllm) -> the report's files (pipeline.acceptance.report_dir)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from pipeline.acceptance import report_dir
from pipeline.acceptance.report import (DraftFiles, Doctor, NotMeasured, PromptSource, Provenance, Report,
                                        Settings, TargetSource, draft_result, plain_result)
from pipeline.acceptance.render import html, markdown
from pipeline.core.cli import RunFailed, UsageError
from pipeline.core.contracts import EngineSpec
from pipeline.core.io import sha256_file
from pipeline.data.mask import encode_chat
from pipeline.data.remote_code import load_tokenizer
from pipeline.data.sources import check_readable
from pipeline.drafts.examine import Request, examine
from pipeline.drafts.report import failed
from pipeline.drafts.target import gather
from pipeline.engines.process.remote import EngineWorkerError
from pipeline.engines.registry import check_options, make_engine
from pipeline.models.info import text_config
from pipeline.regen.prompts import read_prompts

ENGINE = "vllm-speculate"  # pipeline.engines.vllm.speculate, through the registry: its options typed and checked
# Options `pipeline.accept` sets from its own flags and the prompts: never an --engine-option.
FROM_FLAGS = {"draft": "--draft", "num_speculative_tokens": "--num-speculative-tokens",
              "max_model_len": "the prompts and --max-tokens"}
SGLANG_REFUSAL = ("--serve sglang: SGLang 0.5.23's EAGLE-3 path calls real sgl-kernel CPU ops "
                  "(copy_all_layer_kv_cache_cpu, fill_accept_out_cache_loc_cpu, ...) that no PyPI build provides, so "
                  "it cannot start on these CPUs; serve with --serve vllm (docs/engines.md says how SGLang's own "
                  "counters are read where it runs)")


def engine_spec(s: Settings, draft: Path | None, max_len: int) -> EngineSpec:
    """The measuring engine as configured; UsageError naming `--engine-option KEY` for an option it does not take
    (the closest valid one named) or a value it cannot take, before any engine starts."""
    if taken := sorted(set(s.engine_options) & set(FROM_FLAGS)):
        raise UsageError(f"--engine-option {taken[0]}: set by {FROM_FLAGS[taken[0]]}, not an engine option here")
    spec = EngineSpec(name=ENGINE, dtype=s.dtype, options={
        **s.engine_options, "draft": str(draft.resolve()) if draft else None,
        "num_speculative_tokens": s.num_speculative_tokens, "max_model_len": max_len})
    try:
        check_options(spec, "--engine-option")
    except ValueError as e:
        raise UsageError(str(e).replace("--engine-option.options.", "--engine-option ")) from None
    return spec


def _target_dir(target: Path | None, run: Path | str | None, export: Path | str | None) -> Path:
    found = gather(run=run, export=export, model_dir=target).model_dir  # TargetError: a usage error
    if found is None or not (Path(found) / "config.json").is_file():
        given = next(f"--{flag} {path}" for flag, path in (("run", run), ("export", export), ("target", target))
                     if path is not None)
        raise UsageError(f"{given}: the target's model directory is not here; pass --target MODEL_DIR")
    return Path(found)


def _prompt_room(model_dir: Path, s: Settings) -> int:
    """The most prompt tokens the served length holds: the target's positions less the answer and the drafts."""
    positions = text_config(json.loads((model_dir / "config.json").read_text())).get("max_position_embeddings")
    room = (positions or 1 << 20) - s.max_tokens - s.num_speculative_tokens - 1
    if room < 1:
        raise UsageError(f"--max-tokens {s.max_tokens}: leaves no room for a prompt in the target's {positions} "
                         "positions")
    return room


def _prompts(path: Path, model_dir: Path, s: Settings) -> tuple[list[list[int]], int]:
    """Each record's first prompt (the messages before its first assistant turn), in the target's chat template with
    the generation prompt; (token ids, rejected records). A record too long for the served length is rejected, and
    one far too long is never read whole (the record bound of data/bounds.py)."""
    tokenizer = load_tokenizer(str(model_dir), False)
    room = _prompt_room(model_dir, s)
    got = read_prompts(path, tokenizer, max_length=room, limit=None, n=1, seed=0)
    ids, rejected = [], len(got.rejects)
    for c in got.conversations:
        messages = list(c.messages)
        first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))
        if first == 0:
            raise UsageError(f"--prompts {path}: row {c.row} opens with an assistant turn, no prompt before it")
        prompt = encode_chat(tokenizer, messages[:first], True, c.tools)
        if len(prompt) > room:
            rejected += 1
            continue
        ids.append(prompt)
    if not ids:
        raise UsageError(f"--prompts {path}: no chat record to prompt with ({rejected} rejected; a prompt may hold at "
                         f"most {room} tokens here)")
    return ids, rejected


def _doctor(draft: Path, model_dir: Path, run: Path | str | None, export: Path | str | None) -> Doctor:
    findings, _ = examine(Request(draft=draft, serve="vllm", run=run, export=export, target=model_dir))  # usage errors
    return Doctor(verdict="MISMATCH" if failed(findings) else "OK",
                  findings=tuple(f"{f.status} {f.check} {f.message}" for f in findings))


def _serve(model_dir: Path, draft: Path | None, prompts: list[list[int]], s: Settings, max_len: int) -> dict:
    num_layers = text_config(json.loads((model_dir / "config.json").read_text()))["num_hidden_layers"]
    engine = make_engine(engine_spec(s, draft, max_len), model_path=str(model_dir), points=[], num_layers=num_layers,
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
    except EngineWorkerError as e:  # vLLM loaded the draft and then failed on it (a d2t of absolute ids does)
        what = f"draft {draft}" if draft is not None else "the plain target"
        raise RunFailed(f"vLLM failed while serving {what}: {' '.join(e.summary.split())}; nothing was "
                        "written") from None
    finally:
        engine.close()


@dataclass(frozen=True)
class Plan:
    """What a measurement needs, all read and checked before any engine starts."""

    model_dir: Path
    doctors: list[Doctor]
    prompt_ids: list[list[int]]
    rejected: int


def prepare(drafts: Sequence[Path], *, target: Path | None, run: Path | str | None, export: Path | str | None,
            prompts: Path, out: Path, overwrite: bool, settings: Settings) -> Plan:
    engine_spec(settings, None, 1)  # the options checked before anything is read or started
    try:
        check_readable(prompts)  # as extract checks data.path: a directory, a FIFO or /dev/zero is no prompt file
    except (OSError, ValueError) as e:
        raise UsageError(f"--prompts {prompts}: {e}") from None
    report_dir.check(out, overwrite=overwrite)
    model_dir = _target_dir(target, run, export)
    doctors = [_doctor(d, model_dir, run, export) for d in drafts]  # every draft read before any engine starts
    ids, rejected = _prompts(prompts, model_dir, settings)
    return Plan(model_dir=model_dir, doctors=doctors, prompt_ids=ids, rejected=rejected)


def measure(drafts: Sequence[Path], *, target: Path | None, run: Path | str | None,
            export: Path | str | None = None, prompts: Path, out: Path, settings: Settings,
            overwrite: bool = False) -> Report:
    plan = prepare(drafts, target=target, run=run, export=export, prompts=prompts, out=out, overwrite=overwrite,
                   settings=settings)
    model_dir, ids = plan.model_dir, plan.prompt_ids
    max_len = max(map(len, ids)) + settings.max_tokens + settings.num_speculative_tokens + 1
    with report_dir.taken(out, overwrite=overwrite):
        served: dict[Path, dict] = {}
        failures: dict[Path, UsageError | RunFailed] = {}
        for d in drafts:  # served before the plain start: a draft vLLM refuses is known early
            try:
                served[d] = _serve(model_dir, d, ids, settings, max_len)
            except (UsageError, RunFailed) as e:  # vLLM refused it or failed on it: the others are still measured
                failures[d] = e
        if not served:
            first = next(iter(failures.values()))
            raise first if len(failures) == 1 else type(first)(
                "no draft could be measured: " + "; ".join(str(e) for e in failures.values()))
        plain = _serve(model_dir, None, ids, settings, max_len)
        report = _report(drafts, served, failures, plain, plan, settings, prompts=prompts, run=run, export=export)
        report_dir.write(out, report_json=report.to_json(), report_md=markdown(report), report_html=html(report))
    return report


def _report(drafts: Sequence[Path], served: dict[Path, dict], failures: dict[Path, UsageError | RunFailed],
            plain: dict, plan: Plan, settings: Settings, *, prompts: Path, run: Path | str | None,
            export: Path | str | None) -> Report:
    names = {d: d.name if [x.name for x in drafts].count(d.name) == 1 else str(d) for d in drafts}
    doctors = dict(zip(drafts, plan.doctors))
    plain_out = plain_result(plain["results"])
    target = TargetSource(path=str(plan.model_dir), config_sha256=sha256_file(plan.model_dir / "config.json"),
                          run=None if run is None else str(run), export=None if export is None else str(export))
    return Report(
        settings=settings, num_prompts=len(plan.prompt_ids), rejected_records=plan.rejected, plain=plain_out,
        drafts=tuple(draft_result(names[d], s, plain_out, doctors[d]) for d, s in served.items()),
        failed=tuple(NotMeasured(name=names[d], path=str(d), exit_code=int(e.exit_code), error=str(e),
                                 doctor=doctors[d]) for d, e in failures.items()),
        provenance=Provenance(
            vllm_version=plain["info"]["framework_version"], target=target,
            prompts=PromptSource(path=str(prompts), sha256=sha256_file(prompts),
                                 prompt_ids=tuple(tuple(ids) for ids in plan.prompt_ids)),
            drafts=tuple(DraftFiles(path=str(d), files={f.name: sha256_file(f) for f in sorted(d.iterdir())
                                                         if f.is_file()}) for d in served),
            environment=plain["info"]["extra"]))
