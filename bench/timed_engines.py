"""Engines with a timing extra for the throughput benches: the same adapters, plus a pass that captures nothing.

The benches register them under their own names (`register_timed_engines`) and call the extra through
`RemoteEngine.call`; the engine's worker imports this module from the repository root (bench scripts run from there).
"""
from __future__ import annotations

import time

import numpy as np

from pipeline.engines.registry import register
from pipeline.engines.sglang.adapter import SGLangEngine
from pipeline.engines.vllm.adapter import VLLMEngine, _capture_plan


def register_timed_engines() -> None:
    register("vllm-timed", "bench.timed_engines:TimedVLLMEngine")
    register("sglang-timed", "bench.timed_engines:TimedSGLangEngine")


class TimedVLLMEngine(VLLMEngine):
    def plain_prefill_seconds(self, prompts: list[list[int]]) -> float:
        """Seconds vLLM takes to prefill `prompts` (max_tokens=1) with the capture hooks removed: the baseline of
        bench/vllm_throughput.py, on this very engine (called through `RemoteEngine.call`)."""
        from vllm import SamplingParams

        self._rpc("capture_remove")
        try:
            start = time.perf_counter()
            self._llm.generate([{"prompt_token_ids": p} for p in prompts],
                               SamplingParams(max_tokens=1, temperature=0.0, detokenize=False), use_tqdm=False)
            return time.perf_counter() - start
        finally:
            self._rpc("capture_install", _capture_plan(self.points, self.num_layers))


    def plain_generate_seconds(self, prompts: list[list[int]], max_tokens: int,
                               stop_ids: list[int]) -> list[float]:
        """[seconds, generated tokens] of vLLM's own `LLM.generate` on `prompts` (greedy, all at once): the baseline
        of bench/regen_throughput.py, on this very engine."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, stop_token_ids=stop_ids, detokenize=False)
        start = time.perf_counter()
        outs = self._llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return [time.perf_counter() - start, float(sum(len(o.outputs[0].token_ids) for o in outs))]


class TimedSGLangEngine(SGLangEngine):
    def forward_seconds(self, prompts: list[list[int]]) -> float:
        """Extra (`RemoteEngine.call`): the runner's forwards alone, aux capture included, nothing moved out."""
        seqs = [np.asarray(p, dtype=np.int64) for p in prompts]
        start = time.perf_counter()
        for group in self._forwards(seqs, [f"prompt {i}" for i in range(len(seqs))]):
            self._session.forward([seqs[i] for i in group])
        return time.perf_counter() - start


    def plain_generate_seconds(self, prompts: list[list[int]], max_tokens: int,
                               stop_ids: list[int]) -> list[float]:
        """[seconds, generated tokens] of SGLang's own `Engine.generate` on `prompts` (greedy, one call): the baseline
        of bench/regen_throughput.py, on the started generate-task engine."""
        params = {"temperature": 0.0, "max_new_tokens": max_tokens, "stop_token_ids": stop_ids}
        start = time.perf_counter()
        outs = self._generator.engine.generate(input_ids=prompts, sampling_params=[dict(params) for _ in prompts])
        outs = [outs] if isinstance(outs, dict) else outs
        return [time.perf_counter() - start, float(sum(len(o["output_ids"]) for o in outs))]
