"""`engine.options` of the SGLang engine (`pipeline.engines.sglang.adapter`); standard library only, so the driver
checks them without importing SGLang (see `pipeline.engines.options`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pipeline.engines.options import EngineOptions, InvalidOption, option

MAX_TOKENS_PER_FORWARD = 16384  # SGLang's default max_prefill_tokens


@dataclass(frozen=True, kw_only=True)
class SGLangOptions(EngineOptions):
    device: Literal["auto", "cpu", "cuda"] = option(
        "auto", "auto = cuda when torch sees a GPU, else cpu; cpu: SGLANG_USE_CPU_ENGINE=1, torch_native attention "
                "and the CPU compatibility layer (pipeline/engines/sglang/cpu/)")
    max_tokens_per_forward: int = option(
        MAX_TOKENS_PER_FORWARD, "one forward's tokens: the KV pool is sized to it and cleared after each forward; a "
                                "longer sample is refused, naming it")
    attention_backend: str | None = option(
        None, "SGLang's attention backend (e.g. fa3); None = SGLang's own choice on GPUs, torch_native on CPU")
    aux_layer_ids: list[int] | None = option(
        None, "a serving config's native eagle3 aux ids, verbatim (e.g. [1, 29, 57]); they must select exactly "
              "capture.points; None = translated from capture.points")
    mem_fraction_static: float | None = option(None, "SGLang's mem_fraction_static; None = SGLang's default")
    log_level: str = option("warning", "SGLang's log level")

    def __post_init__(self) -> None:
        if self.max_tokens_per_forward < 1:
            raise InvalidOption("max_tokens_per_forward", self.max_tokens_per_forward, "must be >= 1")
        if self.mem_fraction_static is not None and not 0 < self.mem_fraction_static <= 1:
            raise InvalidOption("mem_fraction_static", self.mem_fraction_static, "must be in (0, 1] or null")
