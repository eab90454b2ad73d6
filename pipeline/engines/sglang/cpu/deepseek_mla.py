"""DeepSeek (MLA) attention on SGLang's `torch_native` backend: register it to the absorbed-MLA dispatch.

SGLang 0.5.23 picks the DeepSeek attention forward method through a per-backend handler table
(`sglang/srt/models/deepseek_common/attention_backend_handler.py`). `torch_native` has no entry, so the lookup falls
back to the triton handler, which picks the MHA prefill path; that path reads the 576-wide MLA latent cache as if it
held per-head K/V and fails with a shape error. The absorbed-MLA dispatch (`_dispatch_mla_subtype`) is the method
SGLang itself uses for decode and cached prefixes on every backend: the same attention, written with the up-projection
absorbed into the query, so this changes which SGLang code path runs, not what it computes (the tests compare every
captured point with Hugging Face transformers to 1e-5 relative L2 in float32).
"""
from __future__ import annotations

BACKEND = "torch_native"


def register() -> str:
    """Register `torch_native` unless SGLang already has a handler for it; returns the handler's qualified name."""
    from sglang.srt.models.deepseek_common import attention_backend_handler as handlers

    registry = handlers.AttentionBackendRegistry
    if BACKEND not in registry._handlers:
        registry.register(BACKEND, handlers._dispatch_mla_subtype)
    return handler_name()


def handler_name() -> str:
    from sglang.srt.models.deepseek_common import attention_backend_handler as handlers

    handler = handlers.AttentionBackendRegistry.get_handler(BACKEND)
    return f"{handler.__module__}.{handler.__qualname__}"
