"""Engines with injected errors, built on the real HF engine, registered by tests (never by the pipeline itself).

- `hf-remap` (options.remap = {claimed: captured}): claims the requested points but captures others in their slots,
  e.g. {b4: b5} (a +1 convention error) or {b1: b4, b4: b1} (two points swapped); "zeros" captures nothing there.
- `hf-scripted` (options.turns = [text, ...]): generates turn k's text (special tokens included, encoded by the
  model's own tokenizer) instead of sampling: what a trained model that reasons or calls tools would write, which the
  tiny random models never do. Everything around it (prompts, template, history, storage) is the pipeline's own.
- `hf-positions` (options.position_shift = k): a rope/position bug like vLLM's CPU rotary kernel on MLA: every
  position after the first is rotated as if it were `k x batch size` further on, so position 0 is exact and the
  error depends on what else is in the batch.

They register as `tests.helpers.faulty_engines:<Class>` (`__name__`): the registry imports that module name, so they
run in this process, or in a worker started from the repository root (where `tests.helpers` is importable too).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

from pipeline.core.contracts import Capture, EngineInfo, Generation, GenerationRequest, PreparedSample
from pipeline.engines.hf import HFEngine
from pipeline.engines.hf_options import HFOptions
from pipeline.engines.options import option
from pipeline.engines.registry import register, unregister
from pipeline.points import parse_point

TARGETS = {"hf-remap": f"{__name__}:RemapHF", "hf-positions": f"{__name__}:PositionBugHF",
           "hf-scripted": f"{__name__}:ScriptedHF"}


@contextmanager
def registered() -> Iterator[None]:
    """The faulty engines in the registry for the duration (the registry is process-wide: leave it as found)."""
    for name, target in TARGETS.items():
        register(name, target)
    try:
        yield
    finally:
        for name in TARGETS:
            unregister(name)


@dataclass(frozen=True, kw_only=True)
class RemapOptions(HFOptions):
    remap: dict[str, str] | None = option(None, "{claimed point: captured point or 'zeros'}")


@dataclass(frozen=True, kw_only=True)
class PositionShiftOptions(HFOptions):
    position_shift: int = option(1, "positions after the first are shifted by this x the batch size")


class RemapHF(HFEngine):
    name = "hf-remap"
    options_type = RemapOptions

    def __init__(self, spec, **kwargs) -> None:
        super().__init__(spec, **kwargs)
        self.claimed = list(self.points)
        remap = dict(self.opts.remap or {})
        self.zeroed = {i for i, p in enumerate(self.claimed) if remap.get(p.label) == "zeros"}
        self.points = [p if remap.get(p.label) in (None, "zeros") else parse_point(remap[p.label],
                                                                                  num_layers=self.num_layers)
                       for p in self.claimed]

    def capture(self, samples: Sequence[PreparedSample]) -> list[Capture]:
        out = super().capture(samples)
        for c in out:
            for i in self.zeroed:
                c.hidden_states_TPH[:, i] = 0
        return out

    def info(self) -> EngineInfo:
        info = super().info()
        for source, claimed in zip(info.points, self.claimed):
            source.point = claimed.label  # the claim, as a mistaken adapter would report it
        return info


class PositionBugHF(HFEngine):
    name = "hf-positions"
    options_type = PositionShiftOptions

    def _position_ids(self, mask: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(mask.shape[1])[None].expand_as(mask)
        return positions + (positions > 0) * self.opts.position_shift * mask.shape[0]


__all__ = ["RemapHF", "PositionBugHF", "registered"]


@dataclass(frozen=True, kw_only=True)
class ScriptedOptions(HFOptions):
    turns: list[str] | None = option(None, "turn k's generated text (special tokens included)")


class ScriptedHF(HFEngine):
    name = "hf-scripted"
    options_type = ScriptedOptions

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        from pipeline.data.remote_code import load_tokenizer

        tokenizer = load_tokenizer(self.model_path, self.trust_remote_code)
        out = []
        for request in requests:
            turn = int(request.request_id.rpartition("/")[2])
            ids = tokenizer(self.opts.turns[turn], add_special_tokens=False)["input_ids"]
            ids = list(ids)[:request.sampling.max_tokens]
            stopped = bool(ids) and ids[-1] in request.sampling.stop_token_ids
            out.append(Generation(request_id=request.request_id, output_ids=tuple(ids),
                                  finish_reason="stop" if stopped else "length", applied={"scripted": True}))
        return out
