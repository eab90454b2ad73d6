"""The entry points of the processes `sglang.Engine` spawns (scheduler, detokenizer) for the generate task.

SGLang starts them with multiprocessing's "spawn": a fresh interpreter that imports the target function's module to
unpickle it, before it unpickles the SGLang objects passed along (server and port args, whose import pulls in
`sgl_kernel` on the CPU engine). This module is that target, so the line below runs in each child before its first
SGLang import: the CPU compatibility layer (`pipeline.engines.sglang.cpu`) is then active there too, without relying
on the worker's main module. On GPUs (`SGLANG_USE_CPU_ENGINE` unset) it does nothing.
"""
from __future__ import annotations

from pipeline.engines.sglang import cpu as sglang_cpu

sglang_cpu.activate_if_cpu_engine()  # module level, on purpose: see above


def run_scheduler_process(*args, **kwargs):
    from sglang.srt.managers.scheduler import run_scheduler_process as run

    return run(*args, **kwargs)


def run_detokenizer_process(*args, **kwargs):
    from sglang.srt.managers.detokenizer_manager import run_detokenizer_process as run

    return run(*args, **kwargs)
