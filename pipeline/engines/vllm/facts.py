"""What vLLM really selected, read inside its worker from the loaded model (not from the arguments that asked).

Runs in the vLLM worker process through `CaptureExtension.capture_facts`; returns JSON-able values only.
"""
from __future__ import annotations

import os
from enum import Enum
from typing import Any

import torch


def _name(obj: Any) -> str | None:
    return None if obj is None else type(obj).__name__


def attention(runner: Any) -> dict[str, Any]:
    """Decode backend per attention layer kind (e.g. AMX_MLA, CPU_ATTN) and the MLA prefill backend, if any."""
    backends, impls, prefill = set(), set(), set()
    for layer in runner.compilation_config.static_forward_context.values():
        backend = getattr(layer, "attn_backend", None)
        if backend is None:
            continue
        backends.add(backend.get_name())
        impls.add(_name(getattr(layer, "impl", None)))
        if getattr(layer, "prefill_backend", None) is not None:
            prefill.add(_name(layer.prefill_backend))
    return {"backend": "+".join(sorted(backends)) or "unknown", "impl": sorted(i for i in impls if i),
            "prefill_backend": sorted(prefill)}


def _enum_attrs(obj: Any) -> dict[str, str]:
    return {k: str(v.value) for k, v in vars(obj).items() if k.endswith("backend") and isinstance(v, Enum)}


def moe(model: torch.nn.Module) -> dict[str, Any] | None:
    """The routed-expert kernel of the first MoE layer: quant method class, backend enum, experts kernel class."""
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        experts = getattr(method, "experts_cls", None) if method is not None else None
        if experts is None:
            continue
        return {"layer": name, "method": _name(method), "experts_kernel": getattr(experts, "__name__", str(experts)),
                **_enum_attrs(method)}
    return None


def rotary(model: torch.nn.Module) -> dict[str, Any] | None:
    """The rotary embedding class and which forward vLLM dispatched it to (forward_cpu = the C++ kernel path)."""
    for name, module in model.named_modules():
        if "Rotary" in type(module).__name__:
            forward = getattr(module, "_forward_method", None)
            return {"layer": name, "class": type(module).__name__,
                    "forward": getattr(forward, "__name__", None)}
    return None


def linear_methods(model: torch.nn.Module) -> list[str]:
    return sorted({_name(m.quant_method) for m in model.modules()
                   if hasattr(m, "quant_method") and not hasattr(m.quant_method, "experts_cls")
                   and m.quant_method is not None})


def threads(parallel: Any) -> dict[str, Any]:
    """The threads the model computes on, read in the process that runs it: on CPU vLLM binds them itself in its
    multiprocessing executor (docs/engines.md#vllm-cpu-threads)."""
    return {"torch_threads": torch.get_num_threads(), "affinity": sorted(os.sched_getaffinity(0)),
            "executor": str(parallel.distributed_executor_backend),
            **{k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OMP_PLACES", "OMP_PROC_BIND",
                                              "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU")}}


def collect(worker: Any) -> dict[str, Any]:
    runner = worker.model_runner
    model = runner.get_model()
    config = worker.vllm_config
    parallel = config.parallel_config
    return {
        "attention": attention(runner),
        "moe": moe(model),
        "rotary": rotary(model),
        "linear_methods": linear_methods(model),
        "parameter_dtypes": sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()}),
        "model_dtype": str(config.model_config.dtype).removeprefix("torch."),
        "quantization": config.model_config.quantization,
        "parallel": {"tp": parallel.tensor_parallel_size, "pp": parallel.pipeline_parallel_size,
                     "dp": parallel.data_parallel_size},
        "scheduler": {"chunked_prefill": bool(config.scheduler_config.enable_chunked_prefill),
                      "max_num_batched_tokens": int(config.scheduler_config.max_num_batched_tokens),
                      "prefix_caching": bool(config.cache_config.enable_prefix_caching)},
        "custom_ops": list(config.compilation_config.custom_ops),
        "device": str(runner.device),
        "threads": threads(parallel),
    }
