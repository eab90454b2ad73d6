"""What a server does with a draft config: which aux ids it reads (and where), whether it switches aux capture on,
which draft class it builds and the fc input width that class expects. Read from the servers' released source:

- SGLang 0.5.23: the target's capture ids come from the draft's `eagle_config.eagle_aux_hidden_state_layer_ids` only
  (model_runner_components/spec_aux_hidden_state.py); `eagle_config.use_aux_hidden_state` (default true) switches
  capture; no ids: layers_to_capture = (2, N//2, N-3). The draft's fc is `target_hidden_size (or hidden_size) x
  (num_aux_hidden_states, else len(eagle_config ids), else 3)` (models/llama_eagle3.py, kimi_k25_eagle3.py). Without
  aux capture the draft is fed the target's H-wide post-norm state and skips fc (its forward projects only when the
  width differs from the embedding's). It has no reader for speculators' config schema.
- vLLM 0.32: ids from the top-level `eagle_aux_hidden_state_layer_ids`, else `eagle_config`'s
  (v1/worker/gpu_model_runner.py `_get_eagle3_aux_layers_from_config`); speculators' config is converted: the draft
  is built from its transformer_layer_config, top-level ids kept (transformers_utils/configs/speculators/base.py,
  algos.py), so its capture switch is `transformer_layer_config.eagle_config.use_aux_hidden_state` (a top-level
  eagle_config is dropped); same defaults; the draft's fc width as SGLang's (model_executor/models/llama_eagle3.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.drafts.checkpoint import Draft
from pipeline.points import Numbering, numbering_for

SERVERS = ("sglang", "vllm")
DEFAULT_VERSIONS = {"sglang": "0.5.23", "vllm": "0.32.0"}
_DRAFT_CLASSES = {  # (server, draft schema) -> the class the server builds; None: the server cannot read the schema
    ("sglang", "specforge"): "LlamaForCausalLMEagle3",
    ("sglang", "mla"): "Eagle3DeepseekV2ForCausalLM",
    ("sglang", "speculators"): None,
    ("vllm", "specforge"): "Eagle3LlamaForCausalLM",
    ("vllm", "mla"): "Eagle3DeepseekV2ForCausalLM",
    ("vllm", "speculators"): "Eagle3LlamaForCausalLM",
}


@dataclass(frozen=True, kw_only=True)
class ServerView:
    framework: str
    version: str
    version_known: bool  # False: the numbering row is the nearest one read, a claim to verify on this version
    numbering: Numbering
    draft_class: str | None  # None: the server cannot read this draft's config
    ids: list[int] | None  # the aux ids the server hands the target; None: its defaults
    ids_from: str  # where it reads them, in words
    use_aux: bool
    eagle_config_from: str  # where the eagle_config this server reads sits in config.json
    num_aux_expected: int  # aux states the server's draft class sizes fc for
    fc_in_expected: int


def _server_ids(draft: Draft, framework: str) -> tuple[list[int] | None, str]:
    if framework == "vllm" and draft.top_level_aux_ids:
        return draft.top_level_aux_ids, "eagle_aux_hidden_state_layer_ids (top level)"
    if draft.eagle_config_aux_ids:
        return draft.eagle_config_aux_ids, "eagle_config.eagle_aux_hidden_state_layer_ids"
    if framework == "sglang" and draft.top_level_aux_ids:
        return None, ("nothing: SGLang 0.5.23 reads only eagle_config.eagle_aux_hidden_state_layer_ids and ignores "
                      "the top-level eagle_aux_hidden_state_layer_ids")
    return None, "nothing: the draft config names no aux ids"


def _num_aux(draft: Draft) -> int:
    """Both servers: num_aux_hidden_states, else len(eagle_config ids), else 3. A speculators config reaches vLLM
    converted (its transformer_layer_config plus a few fields): only an eagle_config nested there counts."""
    if draft.num_aux_hidden_states:
        return draft.num_aux_hidden_states
    ids = draft.eagle_config_aux_ids
    return len(ids) if ids else 3


def view(draft: Draft, framework: str, *, model_type: str, architecture: str | None,
         version: str | None) -> ServerView:
    version = version or DEFAULT_VERSIONS[framework]
    row, known = numbering_for(framework, model_type=model_type, architecture=architecture, version=version)
    ids, where = _server_ids(draft, framework)
    use_aux = draft.use_aux_hidden_state is not False
    num_aux = _num_aux(draft)
    return ServerView(framework=framework, version=version, version_known=known, numbering=row,
                      draft_class=_DRAFT_CLASSES[(framework, draft.format)], ids=ids, ids_from=where,
                      use_aux=use_aux, eagle_config_from=draft.eagle_config_from, num_aux_expected=num_aux,
                      fc_in_expected=draft.input_width * num_aux)
