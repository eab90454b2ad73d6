"""vLLM's ranks on CPU split this process's CPUs among them (pipeline/engines/vllm/cpu_ranks.py; the TP 2 runs:
tests/integration/test_vllm_engine.py)."""
from __future__ import annotations

import os

import pytest

from pipeline.engines.vllm.cpu_ranks import BIND_ENV, bind_cpu_ranks, cpu_list


def test_a_cpu_list_is_written_as_vllm_and_taskset_read_it():
    assert cpu_list([0, 1, 2, 5]) == "0-2,5" and cpu_list([3]) == "3" and cpu_list([0, 2, 3, 4, 7, 8]) == "0,2-4,7-8"


def test_the_ranks_get_contiguous_shares_of_this_processs_cpus(monkeypatch):
    monkeypatch.delenv(BIND_ENV, raising=False)
    monkeypatch.delenv("VLLM_CPU_NUM_OF_RESERVED_CPU", raising=False)
    cpus = sorted(os.sched_getaffinity(0))
    assert bind_cpu_ranks(1, on_cpu=True) is None and bind_cpu_ranks(2, on_cpu=False) is None
    assert BIND_ENV not in os.environ
    if len(cpus) >= 2:
        assert bind_cpu_ranks(2, on_cpu=True).startswith("the adapter")
        share = len(cpus) // 2
        assert os.environ[BIND_ENV] == f"{cpu_list(cpus[:share])}|{cpu_list(cpus[share:2 * share])}"
        assert bind_cpu_ranks(2, on_cpu=True) == "the environment"  # set now: never replaced
    monkeypatch.delenv(BIND_ENV, raising=False)
    with pytest.raises(ValueError, match=rf"engine.tp_size={len(cpus) + 1} on CPU needs a core per rank; this "
                                         rf"process may use {len(cpus)} CPU\(s\)"):
        bind_cpu_ranks(len(cpus) + 1, on_cpu=True)
