"""`engine.options` of the HF reference engine (`pipeline.engines.hf`); standard library only (see
`pipeline.engines.options`)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from pipeline.engines.options import EngineOptions, InvalidOption, option

DEVICE = re.compile(r"^(cpu|auto|cuda(:\d+)?)$")


@dataclass(frozen=True, kw_only=True)
class HFOptions(EngineOptions):
    attn_implementation: str = option(
        "sdpa", "transformers' attention implementation (`from_pretrained(attn_implementation=...)`): sdpa, eager, "
                "flash_attention_2, ...; a name transformers does not know fails at engine start, naming it")
    device: str = option(
        "cpu", "where the model runs: cpu, cuda, cuda:N, or auto (cuda when the engine's host has one, else cpu); "
               "captures are copied to host memory in the dtype captured, and provenance records the device")

    def __post_init__(self) -> None:
        if not DEVICE.match(self.device):
            raise InvalidOption("device", self.device, "must be cpu, cuda, cuda:N or auto")
