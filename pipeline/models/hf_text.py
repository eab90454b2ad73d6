"""The text model of a checkpoint, loaded with transformers: a causal LM as its own class, or the DeepSeek-V3 backbone
inside Kimi-K2.5's multimodal wrapper.

transformers 5.19 knows `kimi_k25` only as an image-text-to-text model (`AutoModelForCausalLM` rejects it). The wrapper's
text model is a plain DeepSeek-V3 whose weights carry a `language_model.` prefix, so it loads exactly as
`DeepseekV3ForCausalLM` from the wrapper's `text_config` with the prefix mapped away; the vision tensors are left
unloaded (the capture is text-only) and transformers' report of them is one line (load_report.py). The wrapper's
layout and transformers' traps with it: docs/engines.md, "Kimi-K2.5's wrapper on every engine".
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from pipeline.models.load_report import held_load_report, settle

# Wrapper model_type -> the weight-name mapping onto the text model's own names. Some re-exports of Kimi-K2.5 write
# `language_model.layers.*` (no `.model.`): the last pattern takes those.
WRAPPERS: dict[str, dict[str, str]] = {
    "kimi_k25": {
        r"^language_model\.model\.": "model.",
        r"^language_model\.lm_head\.": "lm_head.",
        r"^language_model\.(?!model\.|lm_head\.)": "model.",
    },
}


class RemoteCodeRequired(ValueError):
    """The checkpoint can only be read by running its own Python files, and model.trust_remote_code is off."""


@dataclass(frozen=True, kw_only=True)
class TextModelLayout:
    wrapper_class: str | None  # the checkpoint's architecture when it wraps the text model, else None
    text_class: str  # the class that holds the decoder layers that are captured
    mla_norm_eps: float | None = None  # set on the MLA latent norms (see _align_mla_norm_eps), None: left as loaded


def _align_mla_norm_eps(model) -> float | None:
    """transformers' DeepSeek-V3 builds the MLA latent norms (q_a_layernorm, kv_a_layernorm) with a fixed eps of 1e-6,
    while vLLM and SGLang use config.rms_norm_eps for them. The two agree for DeepSeek-V3 (1e-6) but not for
    Kimi-K2.5 (1e-5): float32 captures then differ by ~1e-5 per few layers. The reference follows the serving
    engines (and the config); provenance records it."""
    eps = getattr(model.config, "rms_norm_eps", None)
    norms = [m for name, m in model.named_modules() if name.endswith(("q_a_layernorm", "kv_a_layernorm"))]
    if eps is None or not norms or all(getattr(m, "variance_epsilon", eps) == eps for m in norms):
        return None
    for m in norms:
        m.variance_epsilon = eps
    return float(eps)


def remote_code_error(path: str, what: str, error: Exception) -> RemoteCodeRequired:
    return RemoteCodeRequired(
        f"model.path={path!r}: its {what} is remote code (the checkpoint's own Python files, named by auto_map) and "
        f"model.trust_remote_code is off; set model.trust_remote_code=true to run it (it executes the checkpoint's "
        f"files with this process's rights; provenance records them) [{type(error).__name__}: {error}]")


def load_config(path: str, *, trust_remote_code: bool):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except ValueError as e:
        if not trust_remote_code and "trust_remote_code" in str(e):
            raise remote_code_error(path, "config", e) from e
        raise


def load_text_model(path: str, *, trust_remote_code: bool = False, **kwargs: Any):
    """(model, layout): a causal LM over the checkpoint's text model; kwargs go to from_pretrained."""
    from transformers import AutoModelForCausalLM

    config = load_config(path, trust_remote_code=trust_remote_code)
    mapping = WRAPPERS.get(config.model_type)
    if mapping is None:
        model = AutoModelForCausalLM.from_pretrained(path, config=config, trust_remote_code=trust_remote_code,
                                                     **kwargs)
        return model, TextModelLayout(wrapper_class=None, text_class=type(model).__name__,
                                      mla_norm_eps=_align_mla_norm_eps(model))
    from transformers import DeepseekV3ForCausalLM

    text_config = copy.deepcopy(config.get_text_config())
    if text_config.model_type not in ("deepseek_v3", "kimi_k2"):
        raise ValueError(f"model.path={path!r}: {config.model_type} wraps a {text_config.model_type!r} text model; "
                         f"the pipeline reads only a DeepSeek-V3 one inside it")
    # Kimi names its DeepSeek-V3 text model kimi_k2, and transformers' Kimi_K25Config keeps that name: transformers
    # then finds no weight conversion for it and leaves every routed expert uninitialised (MISSING in its report).
    text_config.model_type = "deepseek_v3"
    with held_load_report(path) as report:  # the wrapper's vision weights stay unread: one line, not a table
        model, loading = DeepseekV3ForCausalLM.from_pretrained(path, config=text_config, key_mapping=mapping,
                                                               output_loading_info=True, **kwargs)
    settle(report, loading, config.model_type, text_prefixes=tuple(sorted(set(mapping.values()))))
    missing = sorted(loading.get("missing_keys") or [])
    if missing:  # a weight left at its random init would make every capture wrong, silently
        raise ValueError(f"model.path={path!r}: the {config.model_type} checkpoint's text model did not load "
                         f"{len(missing)} weight(s), e.g. {missing[:3]}")
    wrapper = (getattr(config, "architectures", None) or [type(config).__name__])[0]
    return model, TextModelLayout(wrapper_class=wrapper, text_class=type(model).__name__,
                                  mla_norm_eps=_align_mla_norm_eps(model))
