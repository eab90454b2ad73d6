"""Tensor parallelism on CPU: one process per rank, each bound to its own CPUs.

vLLM's own `auto` binding wants a NUMA node per rank (on one node it refuses: "Not enough allowed NUMA nodes"). Unless
the user set VLLM_CPU_OMP_THREADS_BIND, the CPUs this process may use are split among the ranks (contiguous,
`0-3|4-7`); a TP with fewer CPUs than ranks is refused before anything loads. The binding is in the provenance (the
environment vLLM ran with, and who bound the threads).
"""
from __future__ import annotations

import os
from typing import Sequence

BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


def cpu_list(cpus: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5' (vLLM's and taskset's CPU list syntax)."""
    out, start = [], None
    for i, cpu in enumerate(cpus):
        start = cpu if start is None else start
        if i + 1 == len(cpus) or cpus[i + 1] != cpu + 1:
            out.append(str(start) if start == cpu else f"{start}-{cpu}")
            start = None
    return ",".join(out)


def bind_cpu_ranks(tp: int, *, on_cpu: bool) -> str | None:
    """Set the binding for `tp` ranks on CPU in this process's environment (read by vLLM when it starts its ranks);
    who bound the threads (the environment, or this adapter), None where nothing bound them (TP 1, a GPU)."""
    if os.environ.get(BIND_ENV):
        return "the environment"
    if tp == 1 or not on_cpu:
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < tp:
        raise ValueError(f"engine.tp_size={tp} on CPU needs a core per rank; this process may use {len(cpus)} "
                         f"CPU(s) ({cpu_list(cpus)}): lower engine.tp_size, or set {BIND_ENV}")
    share = len(cpus) // tp
    os.environ[BIND_ENV] = "|".join(cpu_list(cpus[r * share:(r + 1) * share]) for r in range(tp))
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")  # every CPU is a rank's: none left to reserve
    return "the adapter (one share of this process's CPUs per rank)"
