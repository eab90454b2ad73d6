"""A stand-in engine for bench/kimi_width.py: captures of Kimi-K2.5's width, produced inside an engine worker.

It runs where vLLM's and SGLang's adapters run (`pipeline.engines.process.worker`, behind `RemoteEngine`) and hands
back [T, P, H] bf16 states cut from one pool made at start, so a capture costs the host path alone (what the
bench measures), not a forward pass. Registered by the bench under its own name; the worker imports it from the
repository root.
"""
from __future__ import annotations

import resource
from dataclasses import dataclass
from typing import Sequence

import torch

from pipeline.core.contracts import Capture, EngineInfo, PreparedSample
from pipeline.engines.base import Engine
from pipeline.engines.options import EngineOptions, option


@dataclass(frozen=True, kw_only=True)
class WideOptions(EngineOptions):
    hidden_size: int = option(7168, "the width of every captured state (Kimi-K2.5's)")
    pool_tokens: int = option(65536, "tokens in the pool the captures are cut from")
    copy: bool = option(False, "copy each capture out of the pool (an engine's capture owns its storage)")


class WideEngine(Engine):
    name = "wide-bench"
    options_type = WideOptions

    def start(self) -> None:
        hidden = self.opts.hidden_size
        gen = torch.Generator().manual_seed(0)
        # Finite, varied values (what validation and the hash see); one pool, each sample a slice at its own offset.
        self._pool = torch.empty(self.opts.pool_tokens, len(self.points), hidden, dtype=torch.bfloat16)
        for rows in self._pool.split(256):  # in blocks: no float32 copy of the whole pool
            rows.copy_(torch.randn(rows.shape, generator=gen))

    def capture(self, samples: Sequence[PreparedSample]) -> list[Capture]:
        out = []
        for s in samples:
            start = s.row * 97 % max(1, self._pool.shape[0] - s.num_tokens)
            hs = self._pool[start:start + s.num_tokens]
            if self.opts.copy:  # an engine's capture owns its storage (a hook's clone / stack)
                hs = hs.clone()
            out.append(Capture(sample_id=s.sample_id, input_ids_T=s.input_ids_T.copy(), hidden_states_TPH=hs))
        return out

    def peak_rss_mib(self) -> float:
        """This worker's peak RSS (`RemoteEngine.call`)."""
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def info(self) -> EngineInfo:
        return EngineInfo(framework="wide-bench", framework_version="0", dtype="bfloat16", quantization={},
                          attention_backend="none", parallel={"tp": 1}, libraries={"torch": torch.__version__})
