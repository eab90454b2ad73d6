"""The comparison itself: finished probe runs analysed against the reference, with the model's own checkpoint.

Shared by `python -m pipeline.diff` (pipeline.compare.job) and the extract gate (pipeline.run.gate).
"""
from __future__ import annotations

import dataclasses
import time
from contextlib import contextmanager
from typing import Any, Sequence

import torch

from pipeline.compare.analyze import Analysis, DiffResult
from pipeline.compare.anchors import Checkpoint
from pipeline.compare.probe import ProbeCapture
from pipeline.config import DiffConfig
from pipeline.core.contracts import PreparedSample
from pipeline.models.info import ModelInfo
from pipeline.shards.storage import choose, rounding_rel_l2

_SMALL_ANALYSIS = 1 << 25  # values of the reference capture (tokens x points x hidden) below which one thread is faster


@contextmanager
def _threads_for(num_values: int):
    """Small probes are analysed on one thread: on a busy CPU, OpenMP's spinning threads make many small tensor
    ops far slower than one thread does (bench/README.md#gate_cost)."""
    before = torch.get_num_threads()
    if num_values < _SMALL_ANALYSIS:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def storage_rounding(runs: Sequence[ProbeCapture], storage_dtype: str | None) -> dict[str, Any] | None:
    """What storing each run's states with `storage_dtype` costs: relative L2 per point of the stored-and-read-back
    states against the captured ones (the figure to set beside the engines' divergence); None when stored as
    captured."""
    measured = [r for r in runs if r.ok]
    if storage_dtype is None or not measured:
        return None
    out: dict[str, Any] = {"dtype": storage_dtype, "rel_l2": {}}
    for run in measured:
        figures = {}
        for label in run.labels:
            x_T1H = torch.cat(run.point(label)).unsqueeze(1)
            storage = choose(x_T1H.dtype, storage_dtype)
            figures[label] = rounding_rel_l2(x_T1H, storage)[0]
        out["scaling"] = storage.scaling
        out["rel_l2"][run.label] = figures
    return out


def compare(runs: Sequence[ProbeCapture], *, reference: str, model: ModelInfo, samples: Sequence[PreparedSample],
            cfg: DiffConfig, storage_dtype: str | None = None) -> DiffResult:
    """Analyse finished runs against the reference (checkpoint anchors and logits from the model's own files); with
    `storage_dtype`, also what storing each compared engine's states that way costs (`DiffResult.storage`)."""
    t0 = time.perf_counter()
    ckpt = Checkpoint(model.path)
    size = sum(s.num_tokens for s in samples) * (model.num_layers + 2) * model.hidden_size
    with _threads_for(size):
        result = Analysis(runs, reference, ckpt=ckpt, cfg=cfg, num_layers=model.num_layers, samples=samples).run()
    return dataclasses.replace(
        result,
        model={"path": str(model.path), "model_type": model.model_type, "architecture": model.architecture,
               "num_layers": model.num_layers, "hidden_size": model.hidden_size, "moe_layers": sorted(ckpt.moe_layers),
               "quantization": (model.quantization or {}).get("quant_method")},
        probe={"num_samples": len(samples), "num_tokens": sum(s.num_tokens for s in samples),
               "samples": [{"sample_id": s.sample_id, "source": s.source, "row": s.row,
                            "num_tokens": s.num_tokens, "truncated": s.truncated} for s in samples]},
        storage=storage_rounding([r for r in runs if r.label != reference], storage_dtype),
        seconds={"analysis": time.perf_counter() - t0})


def report_config(cfg: DiffConfig, **extra: Any) -> dict[str, Any]:
    return {**dataclasses.asdict(cfg), **extra}


