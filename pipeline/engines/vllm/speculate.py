"""vLLM serving a target with an EAGLE-3 draft (or none), one prompt at a time, reading vLLM's own spec-decode counters
around each prompt: what `pipeline.accept` measures acceptance from. Runs in .venv-vllm through the worker transport
(`RemoteEngine.call("measure", ...)`); every vLLM quirk of speculative serving stays here.

- `speculative_config={"method": "eagle3", "model": DRAFT, "num_speculative_tokens": K}` (vllm/config/speculative.py);
  a speculators-format draft directory is read as is.
- The counters exist only with `disable_log_stats=False`; `LLM.get_metrics()` returns Prometheus snapshots: Counter
  `vllm:spec_decode_num_drafts`, `..._num_draft_tokens`, `..._num_accepted_tokens` and the Vector
  `vllm:spec_decode_num_accepted_tokens_per_pos` (vllm/v1/metrics/reader.py), cumulative since the engine started, so
  one prompt's figures are the difference of two reads.
- Prefix caching off: a later prompt sharing a prefix would skip prefill and change what the draft is fed.
"""
from __future__ import annotations

import os
import time
from typing import Any, Sequence

from pipeline.core.contracts import Capture, EngineInfo, PreparedSample
from pipeline.engines.base import Engine
from pipeline.engines.vllm.options import SpeculateOptions

COUNTERS = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
            "vllm:spec_decode_num_accepted_tokens": "accepted"}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


class SpeculativeVLLM(Engine):
    """A measuring engine (registered as `vllm-speculate`, `task="generate"`): its options are `SpeculateOptions`."""

    name = "vllm-speculate"
    environment = ".venv-vllm"
    options_type = SpeculateOptions

    def start(self) -> None:
        o: SpeculateOptions = self.opts
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(o.kv_cache_space_gib))
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the EngineCore in this process: faster start here
        from vllm import LLM

        self.k = o.num_speculative_tokens
        self.speculative = None
        if o.draft:
            self.speculative = {"method": "eagle3", "model": o.draft, "num_speculative_tokens": self.k}
        self._llm = LLM(model=self.model_path, dtype=self.dtype, seed=o.seed, enforce_eager=True,
                        enable_prefix_caching=False, gpu_memory_utilization=o.gpu_memory_utilization,
                        max_model_len=o.max_model_len, disable_log_stats=False,
                        speculative_config=self.speculative, trust_remote_code=self.trust_remote_code)

    def _counters(self) -> dict[str, Any]:
        got: dict[str, Any] = {name: 0 for name in COUNTERS.values()} | {"accepted_per_pos": [0] * self.k}
        for metric in self._llm.get_metrics():
            if metric.name in COUNTERS:
                got[COUNTERS[metric.name]] += int(metric.value)  # summed over label sets (one per engine here)
            elif metric.name == PER_POS:
                got["accepted_per_pos"] = [a + int(b) for a, b in zip(got["accepted_per_pos"], metric.values)]
        return got

    def measure(self, prompts: Sequence[Sequence[int]], max_tokens: int, temperature: float, seed: int) -> list[dict]:
        """Each prompt generated alone: its output ids, seconds, and the counters before and after it."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed, detokenize=False)
        self._llm.generate([{"prompt_token_ids": list(prompts[0])}], params, use_tqdm=False)  # warm-up, not counted
        out = []
        for ids in prompts:
            before = self._counters()
            t0 = time.perf_counter()
            (result,) = self._llm.generate([{"prompt_token_ids": list(ids)}], params, use_tqdm=False)
            seconds = time.perf_counter() - t0
            out.append({"output_ids": list(result.outputs[0].token_ids), "seconds": seconds,
                        "finish_reason": result.outputs[0].finish_reason, "before": before,
                        "after": self._counters()})
        return out

    def capture(self, samples: Sequence[PreparedSample]) -> list[Capture]:
        raise NotImplementedError("the speculative vLLM engine measures acceptance; it captures nothing")

    def info(self) -> EngineInfo:
        import vllm

        return EngineInfo(framework="vllm", framework_version=vllm.__version__, dtype=self.dtype, quantization={},
                          attention_backend="", parallel={"tp": 1}, libraries={"vllm": vllm.__version__},
                          extra={"speculative_config": self.speculative,
                                 "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE")})

    def close(self) -> None:
        llm = self.__dict__.pop("_llm", None)
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
