"""Run by an engine's own interpreter: hand aux id lists to that engine's own model classes and report what they set.

    python engine_numbering.py sglang|vllm REQUEST_JSON RESULT_JSON

REQUEST_JSON: {"num_layers": N, "ids": [[...], ...], "drafts": [DRAFT_DIR, ...]}. For each model class (Llama,
DeepSeek-V2/V3, the Kimi-K2.5 wrapper) the class's own EAGLE-3 setter runs on a bare instance (no weights: the setters
read only the layer count and the pipeline rank); SGLang's `layers_to_capture` / vLLM's `aux_hidden_state_layers` are
what its forward compares the decoder layer index with (value v = the input of layer v = boundary v; the engine tests
in this directory verify that meaning on the tiny models). For vLLM, each draft directory's config is read by vLLM's
own config loader and its aux ids by the model runner's own `_get_eagle3_aux_layers_from_config`.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))


def _bare(cls, num_layers: int, inner=None):
    """An instance of `cls` without weights; `inner`: the class of its decoder stack (`.model`), bare too."""
    import torch

    obj = cls.__new__(cls)
    torch.nn.Module.__init__(obj)
    obj.pp_group = SimpleNamespace(is_last_rank=True)
    obj.config = SimpleNamespace(num_hidden_layers=num_layers)
    if inner is None:
        obj.model = SimpleNamespace(layers=[None] * num_layers, end_layer=num_layers)
    else:
        model = inner.__new__(inner)
        torch.nn.Module.__init__(model)
        model.end_layer = num_layers
        obj.model = model
    return obj


def _set_by_each_class(classes, wrapper, id_lists, *, build, text_class, set_ids, read) -> dict[str, list]:
    """{class name: [what its own EAGLE-3 setter set, for each id list]} for `classes` and the Kimi-K2.5 `wrapper`,
    whose setter reaches its text model (`build(text_class)`, as `language_model`)."""
    import torch

    out = {}
    for cls in (*classes, wrapper):
        got = []
        for ids in id_lists:
            if cls is wrapper:
                obj = cls.__new__(cls)
                torch.nn.Module.__init__(obj)
                obj.language_model = build(text_class)
                holder = obj.language_model
            else:
                obj = holder = build(cls)
            set_ids(obj, ids)
            got.append(list(read(holder.model)))
        out[cls.__name__] = got
    return out


def sglang(request: dict) -> dict:
    from pipeline.engines.sglang.cpu import activate

    activate()
    from sglang.srt.models.deepseek_v2 import DeepseekV2ForCausalLM
    from sglang.srt.models.kimi_k25 import KimiK25ForConditionalGeneration
    from sglang.srt.models.llama import LlamaForCausalLM

    n = request["num_layers"]
    return {"classes": _set_by_each_class(
        (LlamaForCausalLM, DeepseekV2ForCausalLM), KimiK25ForConditionalGeneration, request["ids"],
        build=lambda cls: _bare(cls, n), text_class=DeepseekV2ForCausalLM,
        set_ids=lambda obj, ids: obj.set_eagle3_layers_to_capture(ids), read=lambda model: model.layers_to_capture)}


def vllm(request: dict) -> dict:
    from vllm.model_executor.models.deepseek_v2 import DeepseekV2ForCausalLM, DeepseekV2Model
    from vllm.model_executor.models.kimi_k25 import KimiK25ForConditionalGeneration
    from vllm.model_executor.models.llama import LlamaForCausalLM, LlamaModel
    from vllm.transformers_utils.config import get_config
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    n = request["num_layers"]
    inner = {LlamaForCausalLM: LlamaModel, DeepseekV2ForCausalLM: DeepseekV2Model}
    out = _set_by_each_class(
        (LlamaForCausalLM, DeepseekV2ForCausalLM), KimiK25ForConditionalGeneration, request["ids"],
        build=lambda cls: _bare(cls, n, inner[cls]), text_class=DeepseekV2ForCausalLM,
        set_ids=lambda obj, ids: obj.set_aux_hidden_state_layers(tuple(ids)),
        read=lambda model: model.aux_hidden_state_layers)
    drafts, flags = {}, {}
    for draft in request.get("drafts", []):
        config = get_config(draft, trust_remote_code=False)
        runner = SimpleNamespace(speculative_config=SimpleNamespace(
            draft_model_config=SimpleNamespace(hf_config=config)))
        ids = GPUModelRunner._get_eagle3_aux_layers_from_config(runner)
        drafts[draft] = None if ids is None else list(ids)
        # what its draft classes read (llama_eagle3.py: getattr(config, ..., False))
        flags[draft] = {k: getattr(config, k, False) for k in ("norm_before_residual", "norm_output")}
    return {"classes": out, "drafts": drafts, "flags": flags}


if __name__ == "__main__":
    framework, request, result = sys.argv[1], json.loads(Path(sys.argv[2]).read_text()), Path(sys.argv[3])
    result.write_text(json.dumps({"sglang": sglang, "vllm": vllm}[framework](request)))
