"""Everything the pipeline needs to run SGLang 0.5.23's CPU engine, in one place, active only on CPU.

Two things, both documented in their modules and in docs/engines.md (#sgl_kernel-stand-in, #deepseek-on-sglang-cpu):
- `sgl_kernel_standin`: an import-time stand-in for `sgl_kernel` (no CPU build exists on PyPI) whose every function
  raises when called; installed only when no real `sgl_kernel` is importable;
- `deepseek_mla`: the `torch_native` attention backend registered to DeepSeek's absorbed-MLA dispatch.
Yarn rope and `moe_layer_freq`, the other two things the DeepSeek architecture needs on CPU, are in the tiny models'
config.json (as in Kimi's real one), not here. Nothing here changes numerics or catches an error.

`activate()` refuses to run unless `SGLANG_USE_CPU_ENGINE=1` (SGLang's own CPU switch, read at its import time), so on
GPU machines the real sgl-kernel is used and none of this loads. It must run in every process that imports SGLang
before that import: in a process SGLang spawns (its scheduler, under `sglang.Engine`), that means at import time of
the main module, which the spawned child re-imports; see `activate_if_cpu_engine`.
"""
from __future__ import annotations

import os
from typing import Any

from pipeline.engines.sglang.cpu import sgl_kernel_standin

CPU_ENGINE_ENV = "SGLANG_USE_CPU_ENGINE"
_activated: dict[str, Any] | None = None


def cpu_engine_requested() -> bool:
    return os.environ.get(CPU_ENGINE_ENV) == "1"


def activate() -> dict[str, Any]:
    """Install the CPU compatibility layer (idempotent); returns what it did, for provenance."""
    global _activated
    if not cpu_engine_requested():
        raise RuntimeError(f"the SGLang CPU compatibility layer is for the CPU engine only, but {CPU_ENGINE_ENV}="
                           f"{os.environ.get(CPU_ENGINE_ENV)!r} (expected '1'); on GPUs the real sgl-kernel is used")
    if _activated is None:
        standin = sgl_kernel_standin.install()
        from pipeline.engines.sglang.cpu import deepseek_mla

        _activated = {
            "sgl_kernel": (f"pipeline stand-in: {len(sgl_kernel_standin.NAMES)} import-time names, each raises if "
                           f"called" if standin else "real sgl_kernel build"),
            "deepseek_torch_native_handler": deepseek_mla.register(),
        }
    return dict(_activated)


def activate_if_cpu_engine() -> dict[str, Any] | None:
    """For a main module that starts `sglang.Engine`: call at import time so its spawned scheduler sees the layer."""
    return activate() if cpu_engine_requested() else None
