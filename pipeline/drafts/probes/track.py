"""Which checkpoint tensors a `load_weights` call wrote, and which parameters it left untouched (torch only: runs in
the engine's environment, inside the probes).

Every floating-point parameter is filled with NaN first (an integer one, vLLM's d2t table, with its lowest value).
The weights iterator is wrapped: when the loader asks for tensor i+1 it has finished with tensor i, so the parameters
whose NaN count fell in between were written by tensor i.
A tensor that wrote nothing at its own step may have been kept for later (MLA's q_a_proj is fused with
kv_a_proj_with_mqa when both arrived); it counts as loaded when its values sit as a block of rows in a parameter that
was written in blocks (a fused one) or after the iterator ran out (a loader that collects every tensor first, as
vLLM's Eagle3 classes do), never in one another tensor filled whole at its own step (two all-ones norms look alike).
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

import torch


def _tracked(p: torch.Tensor) -> bool:
    return p.is_floating_point() or (p.dtype in (torch.int32, torch.int64))


def _unset(p: torch.Tensor) -> torch.Tensor:
    """Where `p` still holds the sentinel: NaN, or the lowest integer for an id table (vLLM's d2t parameter)."""
    return torch.isnan(p) if p.is_floating_point() else p == torch.iinfo(p.dtype).min


def _fill(p: torch.Tensor) -> None:
    p.fill_(float("nan") if p.is_floating_point() else torch.iinfo(p.dtype).min)


def _nan_counts(params: dict[str, torch.Tensor]) -> dict[str, int]:
    return {n: int(_unset(p).sum()) for n, p in params.items() if _tracked(p)}


def _found(weight: torch.Tensor, params: dict[str, torch.Tensor]) -> bool:
    if weight.dim() == 0 or weight.dtype == torch.bool:
        return False
    for p in params.values():
        if p.dim() != weight.dim() or p.shape[1:] != weight.shape[1:] or p.shape[0] < weight.shape[0]:
            continue
        w = weight.to(p.dtype)
        first = (p == w[0]).reshape(p.shape[0], -1).all(dim=1).nonzero().flatten().tolist()
        if any(torch.equal(p[i:i + w.shape[0]], w) for i in first if i + w.shape[0] <= p.shape[0]):
            return True
    return False


class Tracker:
    def __init__(self, model: torch.nn.Module, side_effects: Callable[[torch.nn.Module], Any]) -> None:
        self.model, self.side_effects = model, side_effects
        self.params = dict(model.named_parameters())
        with torch.no_grad():
            for p in self.params.values():
                if _tracked(p):
                    _fill(p)
        self.counts = _nan_counts(self.params)
        self.state = side_effects(model)
        self.names: list[str] = []
        self.wrote: dict[str, list[str]] = {}
        self.kept: dict[str, torch.Tensor] = {}
        self.fused: set[str] = set()  # parameters written in blocks by tensors smaller than themselves
        self.at_end: dict[str, int] | None = None  # unset counts when the iterator ran out

    def _step_done(self, name: str, weight: torch.Tensor) -> None:
        counts = _nan_counts(self.params)
        wrote = [n for n, c in counts.items() if c < self.counts[n]]
        state = self.side_effects(self.model)
        if state != self.state:
            wrote.append("(an attribute: " + ", ".join(k for k in state if state[k] != self.state.get(k)) + ")")
        self.counts, self.state = counts, state
        self.wrote[name] = wrote
        for n in wrote:
            p = self.params.get(n)
            if p is not None and (weight.dim() == 0 or p.dim() != weight.dim() or p.shape[0] > weight.shape[0]):
                self.fused.add(n)
        if not wrote:
            self.kept[name] = weight

    def wrap(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        pending = None
        for name, weight in weights:
            if pending is not None:
                self._step_done(*pending)
            self.names.append(name)
            pending = (name, weight)
            yield name, weight
        if pending is not None:
            self._step_done(*pending)
        self.at_end = dict(self.counts)

    def result(self) -> dict[str, Any]:
        # a loader that collects every tensor first (vLLM's Eagle3 load_weights) writes after the iterator ran out
        late = {n for n, c in _nan_counts(self.params).items() if self.at_end is not None and c < self.at_end[n]}
        candidates = {n: self.params[n] for n in self.fused | late}
        dropped = [n for n, w in self.kept.items() if not _found(w, candidates)]
        untouched, partial = [], []
        for n, p in self.params.items():
            if not _tracked(p):
                continue
            nan = _unset(p)
            if bool(nan.all()):
                untouched.append(n)
            elif bool(nan.any()):
                rows = nan.reshape(p.shape[0], -1).any(dim=1) if p.dim() else nan.reshape(1)
                first = int(rows.nonzero()[0])
                partial.append({"name": n, "nan_rows": int(rows.sum()), "rows": int(p.shape[0]),
                                "tail_only": bool(rows[first:].all())})
        return {"num_tensors": len(self.names), "dropped": dropped, "uninitialised": untouched,
                "partial": partial, "wrote": self.wrote}
