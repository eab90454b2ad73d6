"""The generate task on SGLang 0.5.23: its real serving path, `sglang.Engine`, fed token ids (pinned to 0.5.23).

The capture task's in-process `ModelRunner` runs extend batches only; generating needs SGLang's scheduler (continuous
batching, decode steps, its sampler and stop checks). `sglang.Engine` runs the tokenizer manager in this process and
spawns the scheduler and detokenizer; their entry points are `pipeline.engines.sglang.spawned`, so the CPU
compatibility layer is active in them before their first SGLang import.

Settings, and why:
- `skip_tokenizer_init=True`: prompts are token ids rendered by the model's own chat template; SGLang never tokenises
  or detokenises (responses carry `output_ids` straight from the scheduler).
- `no_stop_trim=True` on every request: the stop/eos id SGLang matched stays in `output_ids` (checked per request).
  SGLang 0.5.23 keeps it in token-id responses by default too (its trim is the detokenizer's, on text); the
  flag makes that explicit.
- KV pool (`max_total_tokens`) = `engine.options.max_tokens_per_forward`: here it bounds the prompt and generated
  tokens of all running requests together; the scheduler admits requests as the pool allows.
- radix cache off (`RADIX_CACHE`): an answer must not depend on which requests ran before it; a prefix served from
  the cache is attended in two pieces (cached prefix + new extend) instead of one, which changes the low bits and
  hence, eventually, sampled or greedy tokens. Regeneration values reproducibility over prefix reuse.
- `sleep_on_idle=True`: an idle scheduler otherwise busy-polls a core.
- Per-request seeds: SGLang reads `sampling_seed` only with `enable_deterministic_inference`, which 0.5.23 refuses
  for the `torch_native` attention backend the CPU engine needs (only ascend/fa3/fa4/flashinfer/intel_xpu/triton).
  So on CPU the seed is passed (SGLang validates it) but not used: sampling draws from the scheduler's torch
  generator, seeded once by `random_seed`, and the sampled tokens of one request depend on what else is in the batch.
  `Generation.applied` says so per request (`seed_honoured: False`). Greedy requests are unaffected.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from pipeline.core.contracts import Generation, GenerationRequest, Sampling

RADIX_CACHE = False  # see the module docstring
RADIX_CACHE_WHY = ("disabled: an answer must not depend on earlier requests (a cached prefix is attended in two "
                   "pieces, which changes the low bits)")


@dataclass(frozen=True, kw_only=True)
class GenerationSettings:
    model_path: str
    dtype: str  # "auto" or a torch dtype name
    device: str  # "cpu" or "cuda"
    attention_backend: str | None  # None: SGLang's own choice
    kv_pool_tokens: int  # SGLang's max_total_tokens: prompt + generated tokens of all running requests
    mem_fraction_static: float | None
    tp_size: int = 1
    random_seed: int = 0  # the scheduler's sampling generator (the only seed SGLang uses on CPU, see above)
    log_level: str = "warning"
    trust_remote_code: bool = False


def engine_kwargs(settings: GenerationSettings) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    if settings.attention_backend:
        extra["attention_backend"] = settings.attention_backend
    if settings.mem_fraction_static is not None:
        extra["mem_fraction_static"] = settings.mem_fraction_static
    return dict(model_path=settings.model_path, device=settings.device, dtype=settings.dtype,
                tp_size=settings.tp_size, skip_tokenizer_init=True, disable_radix_cache=not RADIX_CACHE,
                disable_cuda_graph=settings.device == "cpu",  # CUDA graphs need CUDA
                max_total_tokens=settings.kv_pool_tokens, random_seed=settings.random_seed,
                log_level=settings.log_level, trust_remote_code=settings.trust_remote_code, sleep_on_idle=True,
                **extra)


def sglang_params(s: Sampling) -> dict[str, Any]:
    """The request's sampling as SGLang's `sampling_params` dict."""
    return {"temperature": s.temperature, "top_p": s.top_p,
            "top_k": s.top_k if s.top_k > 0 else -1,  # SGLang's "no cut" is -1 (the contract's is 0)
            "max_new_tokens": s.max_tokens, "stop_token_ids": list(s.stop_token_ids) or None,
            "sampling_seed": s.seed, "no_stop_trim": True}


def _engine_class():
    from sglang.srt.entrypoints.engine import Engine  # `sglang.Engine` itself is a lazy-import proxy

    from pipeline.engines.sglang import spawned

    class PipelineSGLangEngine(Engine):
        """`sglang.Engine` whose spawned processes start in `spawned` (the CPU layer active before SGLang)."""

        run_scheduler_process_func = staticmethod(spawned.run_scheduler_process)
        run_detokenizer_process_func = staticmethod(spawned.run_detokenizer_process)

    return PipelineSGLangEngine


class GenerationSession:
    """A started `sglang.Engine` and the generate call of the adapter."""

    def __init__(self, settings: GenerationSettings) -> None:
        self.settings = settings
        self.engine = None

    def start(self) -> None:
        self.engine = _engine_class()(**engine_kwargs(self.settings))
        tm = self.engine.tokenizer_manager
        self._preferred = dict(tm.preferred_sampling_params or {})
        self._model_config = tm.model_config
        self._eos = sorted(int(t) for t in (tm.model_config.hf_eos_token_id or ()))
        # One prefill and one decode step now: one-off costs are paid at start, not in the first real call, and a
        # decode path that needs a real sgl_kernel op (the CPU stand-in raises) fails the start, not a run.
        warm = Sampling(max_tokens=2, stop_token_ids=())
        self.engine.generate(input_ids=[list(range(1, 9))],
                             sampling_params=[{**sglang_params(warm), "ignore_eos": True}])

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        if not requests:
            return []
        params = [sglang_params(r.sampling) for r in requests]
        # One call for the whole list: the scheduler batches the requests continuously as it admits them.
        outs = self.engine.generate(input_ids=[list(r.prompt_ids) for r in requests], sampling_params=params)
        if isinstance(outs, dict):  # SGLang answers a one-element batch with a bare dict
            outs = [outs]
        if len(outs) != len(requests):
            raise RuntimeError(f"SGLang answered {len(outs)} of {len(requests)} generation requests")
        return [Generation(request_id=r.request_id, output_ids=tuple(int(t) for t in out["output_ids"]),
                           finish_reason=_finish_reason(r, out), applied=self.applied(p))
                for r, p, out in zip(requests, params, outs)]

    def applied(self, params: dict[str, Any]) -> dict[str, Any]:
        """What SGLang applies for these params: its own `SamplingParams` built as its tokenizer manager builds it
        (preferred defaults under the request's values), normalised and verified, read field by field."""
        from sglang.srt.sampling.sampling_params import TOP_K_ALL, SamplingParams

        sp = SamplingParams(**{**self._preferred, **params})
        sp.normalize(None)
        sp.verify(self._model_config.vocab_size)
        return {
            "temperature": sp.temperature,  # greedy requests read 1.0 here: SGLang turns temperature 0 into top_k=1
            "greedy": sp.top_k == 1,
            "top_p": sp.top_p, "top_k": 0 if sp.top_k >= TOP_K_ALL else sp.top_k,  # 0: whole vocabulary
            "min_p": sp.min_p, "repetition_penalty": sp.repetition_penalty,
            "frequency_penalty": sp.frequency_penalty, "presence_penalty": sp.presence_penalty,
            "min_new_tokens": sp.min_new_tokens, "max_new_tokens": sp.max_new_tokens,
            "stop_token_ids": sorted(sp.stop_token_ids or ()), "ignore_eos": sp.ignore_eos,
            # ignore_eos False: SGLang also stops on the model's own eos ids (config.json + generation_config.json)
            "eos_token_ids": [] if sp.ignore_eos else self._eos,
            "no_stop_trim": sp.no_stop_trim, "logit_bias": sp.logit_bias, "n": sp.n,
            # the request's seed as SGLang holds it (sampling_seed), and that SGLang does not sample with it
            "seed": sp.sampling_seed, "seed_honoured": False, "random_seed": self.settings.random_seed,
        }

    def facts(self) -> dict[str, Any]:
        """What the started engine is (provenance), read from its objects."""
        import sglang
        from sglang.srt.arg_groups.overrides import resolved_view

        args, mc = self.engine.server_args, self._model_config
        view = resolved_view(args)
        return {
            "sglang_version": sglang.__version__,
            "dtype": str(mc.dtype).removeprefix("torch."),
            "attention_backend": str(view.attention_backend),
            "sampling_backend": str(getattr(view, "sampling_backend", None)),
            "quantization": mc.quantization,
            "architecture": (getattr(mc.hf_config, "architectures", None) or [None])[0],
            "tp": int(view.tp_size), "pp": int(view.pp_size),
            "device": str(view.device),
            "kv_pool_tokens": int(self.settings.kv_pool_tokens),
            "context_length": int(mc.context_len),
            "eos_token_ids": self._eos,
        }

    def close(self) -> None:
        if self.engine is not None:
            engine, self.engine = self.engine, None
            engine.shutdown()


def _finish_reason(request: GenerationRequest, out: dict[str, Any]) -> str:
    """SGLang's finish_reason as "stop" or "length", after checking the ids say the same."""
    reason = (out.get("meta_info") or {}).get("finish_reason") or {}
    kind, ids = reason.get("type"), out["output_ids"]
    if kind == "stop" and isinstance(reason.get("matched"), int):
        if not ids or ids[-1] != reason["matched"]:
            raise RuntimeError(f"request {request.request_id!r}: SGLang stopped on id {reason['matched']} but its "
                               f"output_ids end with {ids[-1:]}: the stop id was trimmed")
        return "stop"
    if kind == "length":
        if len(ids) != request.sampling.max_tokens:
            raise RuntimeError(f"request {request.request_id!r}: SGLang reports a length finish after {len(ids)} "
                               f"ids, max_tokens={request.sampling.max_tokens}")
        return "length"
    raise RuntimeError(f"request {request.request_id!r}: SGLang finished with {reason!r}, neither a stop id nor "
                       f"max_tokens")
