"""vLLM's max_model_len and CPU KV-cache space, sized from the run when the options leave them unset.

vLLM refuses to start unless one request of max_model_len tokens fits in the KV cache, and on CPU that cache is a
fixed VLLM_CPU_KVCACHE_SPACE (whole GiB). The checkpoint's context (Kimi-K2.5: 262144, capped at 8192) is far longer
than what a capture sends, so sizing from the checkpoint asks for caches these machines do not have (61 float32 MLA
layers at 8192 positions: 1.07 GiB, over the 1 GiB that used to be the default). A capture sends prompts of known
length and generates one token, so the longest sequence the run sends bounds both. Standard library only: unit-tested
without vLLM.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

GIB = 1 << 30
CHECKPOINT_CAP = 8192  # the context used when the run's longest sequence is unknown
_BLOCK = 256  # tokens per sequence rounded up to this: vLLM allocates whole blocks (16 for CPU MLA, up to 128 else)
_MEMORY_SHARE = 0.5  # at most this share of the memory available at start goes to the KV cache (weights need room)
_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


class KVCacheTooLarge(ValueError):
    """One sequence of max_model_len tokens needs more KV cache than this machine can give."""


@dataclass(frozen=True, kw_only=True)
class Sizes:
    max_model_len: int
    max_model_len_by: str  # "engine.options.max_model_len", "the run's longest sequence" or "the checkpoint"
    kv_cache_space_gib: int | None  # None: not on CPU, vLLM's own memory settings apply
    kv_cache_space_by: str | None
    kv_bytes_per_token: int


def kv_bytes_per_token(checkpoint: dict[str, Any], dtype: str, tp_size: int = 1) -> int:
    """Bytes of KV cache one token takes on one rank: MLA keeps one latent (kv_lora_rank + rope dims) per layer,
    replicated across ranks; other attention keeps a key and a value per KV head, split across ranks."""
    layers = int(checkpoint["num_hidden_layers"])
    width = _BYTES.get(dtype) or _BYTES.get(str(checkpoint.get("dtype") or checkpoint.get("torch_dtype")), 4)
    if "kv_lora_rank" in checkpoint:
        return layers * (int(checkpoint["kv_lora_rank"]) + int(checkpoint.get("qk_rope_head_dim") or 64)) * width
    heads = int(checkpoint.get("num_key_value_heads") or checkpoint["num_attention_heads"])
    head_dim = int(checkpoint.get("head_dim") or checkpoint["hidden_size"] // checkpoint["num_attention_heads"])
    return layers * 2 * max(1, heads // tp_size) * head_dim * width


def available_memory_bytes() -> int:
    """MemAvailable of /proc/meminfo (what can be allocated without swapping), else the physical memory."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _max_model_len(set_len: int | None, longest: int | None, checkpoint: dict[str, Any]) -> tuple[int, str]:
    if set_len is not None:
        return set_len, "engine.options.max_model_len"
    if longest is not None:
        return longest + 1, "the run's longest sequence + the one generated token"
    return min(int(checkpoint.get("max_position_embeddings") or CHECKPOINT_CAP), CHECKPOINT_CAP), "the checkpoint"


def size(checkpoint: dict[str, Any], *, dtype: str, tp_size: int, batch_size: int, longest: int | None,
         max_model_len: int | None, kv_cache_space_gib: int | None, on_cpu: bool,
         available_bytes: int | None = None) -> Sizes:
    """What to start vLLM with. An option that is set is taken as given (vLLM itself then says whether it fits).
    Unset on CPU, the KV space holds a batch of max_model_len sequences, at least one, within the memory share;
    KVCacheTooLarge names the options when not even one fits."""
    length, length_by = _max_model_len(max_model_len, longest, checkpoint)
    per_token = kv_bytes_per_token(checkpoint, dtype, tp_size)
    if not on_cpu:
        return Sizes(max_model_len=length, max_model_len_by=length_by, kv_cache_space_gib=None,
                     kv_cache_space_by=None, kv_bytes_per_token=per_token)
    if kv_cache_space_gib is not None:
        return Sizes(max_model_len=length, max_model_len_by=length_by, kv_cache_space_gib=kv_cache_space_gib,
                     kv_cache_space_by="engine.options.kv_cache_space_gib", kv_bytes_per_token=per_token)
    one = math.ceil(length / _BLOCK) * _BLOCK * per_token
    cap = int((available_memory_bytes() if available_bytes is None else available_bytes) * _MEMORY_SHARE)
    if one > cap:
        raise KVCacheTooLarge(
            f"max_model_len={length} ({length_by}) needs {one / GIB:.2f} GiB of KV cache for one sequence, more than "
            f"{_MEMORY_SHARE:.0%} of this machine's available memory ({cap / _MEMORY_SHARE / GIB:.1f} GiB): set "
            f"options.max_model_len lower (or data.max_length), or options.kv_cache_space_gib explicitly")
    gib = math.ceil(min(one * batch_size, cap) / GIB)
    if gib * GIB > cap:  # whole GiB: round down to the share, but never below one sequence
        gib = max(math.ceil(one / GIB), cap // GIB)
    return Sizes(max_model_len=length, max_model_len_by=length_by, kv_cache_space_gib=max(1, gib),
                 kv_cache_space_by=f"{batch_size} x max_model_len (at most {_MEMORY_SHARE:.0%} of available memory)",
                 kv_bytes_per_token=per_token)
