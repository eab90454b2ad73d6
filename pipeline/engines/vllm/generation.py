"""vLLM's generation in the contract's words (pipeline.core.contracts.Generation): prompts as token ids, why each
stopped, and the sampling values vLLM really applied (its defaults and the model's generation config merged in)."""
from __future__ import annotations

import json
from typing import Any, Sequence

from pipeline.core.contracts import Generation, GenerationRequest


def _finish(reason: str | None) -> str:
    """vLLM's finish reason in the contract's words: "stop" (an eos or stop id, kept in the ids) or "length"."""
    if reason not in ("stop", "length"):
        raise RuntimeError(f"vLLM finished a generation with reason {reason!r}, neither stop nor length")
    return reason


# The SamplingParams fields that decide which tokens come out; read back after vLLM filled its defaults and merged
# the model's generation config (`_all_stop_token_ids` holds the eos ids it stops on besides the requested ones).
_APPLIED = ("temperature", "top_p", "top_k", "min_p", "seed", "max_tokens", "min_tokens", "repetition_penalty",
            "presence_penalty", "frequency_penalty", "stop_token_ids", "ignore_eos", "logit_bias", "bad_words")


def _applied(params: Any) -> dict[str, Any]:
    applied = {key: getattr(params, key, None) for key in _APPLIED}
    applied["all_stop_token_ids"] = sorted(getattr(params, "_all_stop_token_ids", ()) or ())
    applied["eos_token_id"] = getattr(params, "_eos_token_id", None)
    return json.loads(json.dumps(applied, default=str))


def generate(llm: Any, requests: Sequence[GenerationRequest]) -> list[Generation]:
    """Every request in one `LLM.generate` call (vLLM schedules them continuously), prompts as token ids."""
    if not requests:
        return []
    from vllm import SamplingParams

    params = [SamplingParams(temperature=r.sampling.temperature, top_p=r.sampling.top_p,
                             top_k=r.sampling.top_k or -1, max_tokens=r.sampling.max_tokens, seed=r.sampling.seed,
                             stop_token_ids=list(r.sampling.stop_token_ids), detokenize=False)
              for r in requests]
    outputs = llm.generate([{"prompt_token_ids": list(r.prompt_ids)} for r in requests], params, use_tqdm=False)
    return [Generation(request_id=r.request_id, output_ids=tuple(o.outputs[0].token_ids),
                       finish_reason=_finish(o.outputs[0].finish_reason), applied=_applied(_as_applied(llm, p)))
            for r, o, p in zip(requests, outputs, params)]


def _as_applied(llm: Any, params: Any) -> Any:
    """The request's SamplingParams as vLLM's input processor completes a clone of them before scheduling (the
    model's generation-config eos ids merged in): what really decided where generation stopped."""
    try:
        processor = llm.llm_engine.input_processor
        applied = params.clone()
        applied.update_from_generation_config(processor.generation_config_fields,
                                              processor.renderer.get_eos_token_id())
    except AttributeError:  # another vLLM's internals: the values as sent
        return params
    return applied
