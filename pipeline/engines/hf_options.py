"""`engine.options` of the HF reference engine (`pipeline.engines.hf`); standard library only (see
`pipeline.engines.options`)."""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.engines.options import EngineOptions, option


@dataclass(frozen=True, kw_only=True)
class HFOptions(EngineOptions):
    attn_implementation: str = option(
        "sdpa", "transformers' attention implementation (`from_pretrained(attn_implementation=...)`): sdpa, eager, "
                "flash_attention_2, ...; a name transformers does not know fails at engine start, naming it")
