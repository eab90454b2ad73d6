"""A regeneration directory (written by `python -m pipeline.regenerate`) as extract's data: the samples it holds.

Each conversation row keeps, per regenerated turn, the prompt ids exactly as the model's chat template rendered them
and the generated ids exactly as the engine produced them. Extract captures those ids without re-tokenising: one
sample per turn (prompt + answer), the loss mask on the generated tokens. Before that, each turn's stored prompt is
rendered again from its stored messages with the tokenizer extract loads: a prompt whose ids differ (the template or
the tokenizer changed since the answers were generated) is rejected as `template_drift`, naming the first differing
token, never captured with ids serving would not produce.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core import jsonfile
from pipeline.core.contracts import PreparedSample, Reject
from pipeline.data.ids import sample_id_for
from pipeline.data.mask import ChatTokenizer, TurnIds, encode_chat
from pipeline.data.prepare import PreparedData
from pipeline.data.regeneration.layout import iter_conversations, manifest_digest, read_manifest
from pipeline.data.sources import RecordError


@dataclass(frozen=True, kw_only=True)
class RegeneratedData:
    source: str  # the directory's name
    digest: str  # manifest_digest: every sample id derives from it and the sample's index
    manifest: dict[str, Any]
    loss_mask: dict[str, Any]
    samples: list[PreparedSample]
    rejects: list[Reject]


def outside_vocabulary(ids: list[int], vocab_size: int | None) -> int | None:
    """The first id that is no token id (negative, or not below `vocab_size` when known), or None."""
    return next((i for i in ids if i < 0 or (vocab_size is not None and i >= vocab_size)), None)


def generated_mask(output_ids: list[int], turn_ids: TurnIds | None, train_think_tags: bool) -> list[int]:
    """1 on every generated token, but (as for recorded answers, pipeline.data.mask) not on an opening `<think>` nor
    the `</think>` of an empty pair unless train_think_tags."""
    mask = [1] * len(output_ids)
    if train_think_tags or turn_ids is None or turn_ids.think is None or not output_ids:
        return mask
    start = 0
    if output_ids[0] == turn_ids.think:
        start = 1
        if len(output_ids) > 1 and output_ids[1] == turn_ids.think_end:
            start = 2
    return [0] * start + mask[start:]


def _json_or_error(text: str, where: str) -> Any:
    """A JSON string of a part (a turn's messages, a conversation's tools), bounded in size and depth; a
    RecordError (that conversation's reject) when it is not one, never a RecursionError that stops the run."""
    try:
        return jsonfile.parse(text, ValueError, where=where)
    except ValueError as e:
        return RecordError("malformed_json", str(e))


def _drift(chat: ChatTokenizer, turn: dict[str, Any], tools: Any) -> str | None:
    """Why the stored prompt is not what the tokenizer renders for the stored messages now, or None."""
    messages = _json_or_error(turn["messages"], "messages")
    for value in (messages, tools):
        if isinstance(value, RecordError):
            raise value
    try:
        rendered = encode_chat(chat.tokenizer, messages, True, tools)
    except Exception as e:  # noqa: BLE001 - the checkpoint's template on one record: that record's reject
        return f"the chat template no longer renders the turn's messages: {type(e).__name__}: {e}"
    stored = list(turn["prompt_ids"])
    if rendered == stored:
        return None
    at = next((i for i, (a, b) in enumerate(zip(stored, rendered)) if a != b), min(len(stored), len(rendered)))
    then = stored[at] if at < len(stored) else "end"
    now = rendered[at] if at < len(rendered) else "end"
    return (f"the stored prompt ({len(stored)} tokens) differs from the tokenizer's rendering of the turn's messages "
            f"({len(rendered)} tokens) from token {at} (stored {then}, rendered {now}): the chat template or the "
            f"tokenizer changed since the answers were generated")


def read_regenerated(root: Path, tokenizer: Any, *, max_length: int, length_policy: str, limit: int | None,
                     train_think_tags: bool, vocab_size: int | None = None,
                     error: type[Exception] = ValueError) -> RegeneratedData:
    """One sample per regenerated turn (prompt + answer), in input order; `limit` counts accepted samples."""
    root = Path(root)
    manifest = read_manifest(root, error)
    digest = manifest_digest(root)
    chat = ChatTokenizer(tokenizer)
    samples: list[PreparedSample] = []
    rejects: list[Reject] = []
    index = 0
    for row in iter_conversations(root, manifest):
        tools = _json_or_error(row["tools"], "tools") if row["tools"] else None
        for turn in row["turns"]:
            if limit is not None and len(samples) >= limit:
                break
            sid = sample_id_for(digest, index)
            result = _sample(chat, turn, tools, sid, root.name, index, max_length=max_length,
                             length_policy=length_policy, train_think_tags=train_think_tags, vocab_size=vocab_size)
            (samples if isinstance(result, PreparedSample) else rejects).append(result)
            index += 1
    loss_mask = {"method": "generated_ids", "train_think_tags": train_think_tags,
                 "trained": "every token the engine generated (an opening <think> and an empty pair's </think> only "
                            "with train_think_tags); no prompt token (system turns, history, template tags)"}
    return RegeneratedData(source=root.name, digest=digest, manifest=manifest, loss_mask=loss_mask,
                           samples=samples, rejects=rejects)


def _sample(chat: ChatTokenizer, turn: dict[str, Any], tools: Any, sid: str, source: str, index: int, *,
            max_length: int, length_policy: str, train_think_tags: bool,
            vocab_size: int | None) -> PreparedSample | Reject:
    try:
        if (why := _drift(chat, turn, tools)) is not None:
            raise RecordError("template_drift", why)
        prompt, output = list(turn["prompt_ids"]), list(turn["output_ids"])
        if (bad := outside_vocabulary(output, vocab_size)) is not None:
            raise RecordError("id_out_of_vocabulary", f"generated id {bad} is not a token id of the target "
                                                      f"(0..{(vocab_size or 0) - 1})" if vocab_size else
                              f"generated id {bad} is negative")
        ids = prompt + output
        mask = [0] * len(prompt) + generated_mask(output, chat.turn_ids, train_think_tags)
        if len(ids) > max_length and length_policy == "reject":
            raise RecordError("too_long", f"{len(ids)} tokens > max_length {max_length}")
        truncated = len(ids) > max_length
        ids, mask = ids[:max_length], mask[:max_length]
        if not any(mask):
            raise RecordError("no_loss_tokens", f"none of the {len(output)} generated tokens lies in the first "
                                                f"{max_length} tokens")
    except RecordError as e:
        return Reject(source=source, row=index, reason=e.reason, detail=e.detail, sample_id=sid)
    return PreparedSample(sample_id=sid, source=source, row=index, input_ids_T=np.asarray(ids, dtype=np.int64),
                          loss_mask_T=np.asarray(mask, dtype=np.uint8), truncated=truncated)


def answers_record(data: RegeneratedData) -> dict[str, Any]:
    """What a run records of the regeneration its data came from: the manifest's digest and what wrote the answers."""
    prov = data.manifest["provenance"]
    engine, model = prov["engine"], prov["model"]
    return {
        "manifest_sha256": data.digest,
        "provenance_digest": data.manifest.get("provenance_digest"),
        "engine": {k: engine.get(k) for k in ("framework", "framework_version", "dtype", "attention_backend")}
        | {"quantization": {k: (engine.get("quantization") or {}).get(k) for k in ("method", "kernel")}},
        "model": {k: model.get(k) for k in ("config_sha256", "tokenizer_sha256", "chat_template_sha256")}
        | {"weights_sha256": (model.get("weights") or {}).get("sha256")},
        "sampling": prov["sampling"]["values"], "truncated": data.manifest.get("truncated"),
        "data": prov.get("data"), "code": prov.get("code"),
    }


def answers_of(data: RegeneratedData) -> PreparedData:
    return PreparedData(source=data.source, source_digest=data.digest, loss_mask=data.loss_mask,
                        samples=data.samples, rejects=data.rejects, regeneration=answers_record(data))
