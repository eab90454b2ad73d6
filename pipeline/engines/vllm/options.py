"""`engine.options` of the vLLM engine (`pipeline.engines.vllm.adapter`); standard library only, so the driver checks
them without importing vLLM (see `pipeline.engines.options`)."""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.engines.options import EngineOptions, InvalidOption, option


@dataclass(frozen=True, kw_only=True)
class VLLMOptions(EngineOptions):
    kv_cache_space_gib: int | None = option(
        None, "VLLM_CPU_KVCACHE_SPACE (GiB, CPU only); None = sized from the run: a batch of max_model_len "
              "sequences, at least one, at most half the memory available at start (vLLM's CPU default asks for more "
              "than small machines have)")
    gpu_memory_utilization: float = option(0.1, "the fraction of (GPU, or on CPU host) memory vLLM reserves, (0, 1]")
    max_model_len: int | None = option(
        None, "vLLM's max_model_len (sizes the KV cache); None = the longest sequence the run sends + 1 (the generated "
              "token), or, when the run does not say, the checkpoint's max_position_embeddings, at most 8192")
    max_num_batched_tokens: int | None = option(
        None, "tokens per scheduler step; longer prompts are prefilled in chunks; None = vLLM's default")
    attention_backend: str | None = option(
        None, "an attention backend to ask vLLM for (e.g. CPU_MLA); None = vLLM's choice, except float32 MLA on CPU, "
              "which asks for CPU_MLA (AMX_MLA takes bf16/fp16 weights only)")
    disable_custom_rotary: bool = option(
        False, "force vLLM's PyTorch rope: the workaround for vLLM's CPU rotary-kernel bug on MLA with non-yarn rope "
               "(docs/engines.md#vllm-cpu-rotary-bug-on-mla); off by default: the pipeline reports what the engine "
               "really does, and provenance records the setting either way")
    engine_core_process: bool | None = option(
        None, "vLLM's EngineCore in its own process (true, vLLM's default) or in the adapter's (false); None = in the "
              "adapter's, except for a multimodal wrapper (Kimi-K2.5), which needs its own")
    seed: int = option(0, "vLLM's seed")

    def __post_init__(self) -> None:
        if self.kv_cache_space_gib is not None and self.kv_cache_space_gib < 1:
            raise InvalidOption("kv_cache_space_gib", self.kv_cache_space_gib, "must be >= 1")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise InvalidOption("gpu_memory_utilization", self.gpu_memory_utilization, "must be in (0, 1]")
        for name in ("max_model_len", "max_num_batched_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise InvalidOption(name, value, "must be >= 1 or null")


@dataclass(frozen=True, kw_only=True)
class SpeculateOptions(EngineOptions):
    """`pipeline.engines.vllm.speculate`: vLLM serving a target with an EAGLE-3 draft, measuring acceptance. `draft`,
    `num_speculative_tokens` and `max_model_len` come from `pipeline.accept`'s own flags; the rest from its
    `--engine-option KEY=VALUE`."""

    draft: str | None = option(None, "the draft directory (a speculators-format EAGLE-3 checkpoint); None = the plain "
                                     "target")
    num_speculative_tokens: int = option(3, "draft tokens proposed per step (K)")
    max_model_len: int = option(2048, "vLLM's max_model_len: the longest prompt plus answer plus K + 1")
    kv_cache_space_gib: int = option(1, "VLLM_CPU_KVCACHE_SPACE (GiB, CPU only)")
    gpu_memory_utilization: float = option(0.1, "the fraction of GPU (or on CPU host) memory vLLM reserves, (0, 1]; "
                                                "raise it on a GPU node")
    seed: int = option(0, "vLLM's seed")

    def __post_init__(self) -> None:
        for name in ("num_speculative_tokens", "max_model_len", "kv_cache_space_gib"):
            if getattr(self, name) < 1:
                raise InvalidOption(name, getattr(self, name), "must be >= 1")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise InvalidOption("gpu_memory_utilization", self.gpu_memory_utilization, "must be in (0, 1]")
