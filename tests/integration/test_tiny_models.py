"""The tiny target models: deterministic builds, Kimi's INT4 checkpoint format, HF loading, sane numerics, caching."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from pipeline.factory import int4
from pipeline.factory.build import Recipe
from pipeline.factory.tiny import (
    MARKER,
    RECIPES,
    ensure_model,
    is_complete,
    main,
)
from pipeline.models import built
from tests.helpers.sweep import sampled

pytestmark = [pytest.mark.integration]

TINY = [name for name, recipe in RECIPES.items() if isinstance(recipe, Recipe)]  # the real model: test_real_model.py
KIMI = ["tiny-kimi-int4", "tiny-kimi-bf16", "tiny-kimi-bf16-defaultrope"]
NUM_MOE_LAYERS, NUM_EXPERTS = 7, 8  # 8 layers, the first dense


@pytest.fixture(scope="session")
def root(models_root) -> Path:
    """Every tiny recipe, as the session's cache holds it (built by setup, or rebuilt here when its recipe changed)."""
    for name in TINY:
        ensure_model(name, models_root)
    return models_root


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(path / "model.safetensors", "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _sha256s(model_dir: Path) -> dict[str, str]:
    return {
        str(p.relative_to(model_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(model_dir.rglob("*"))
        if p.is_file()
    }


def _load(path: Path, **kwargs):
    from pipeline.models.hf_text import load_text_model

    return load_text_model(str(path), **kwargs)[0].eval()


def _tokenizer(path: Path):
    from transformers import AutoTokenizer

    # The K2.5 recipes ship Kimi's remote-code tokenizer shape (this project's own tokenization_kimi.py).
    return AutoTokenizer.from_pretrained(str(path), trust_remote_code=(path / "tokenization_kimi.py").is_file())


def _chat_ids(path: Path) -> torch.Tensor:
    tok = _tokenizer(path)
    messages = [
        {"role": "user", "content": "Explain how rotary position embeddings work, in two sentences."},
        {"role": "assistant", "content": "They rotate query and key vectors by an angle that grows with position."},
    ]
    ids = tok.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
    return torch.tensor([ids])


# --- determinism -------------------------------------------------------------------------------------------------


# One recipe per builder path (plain Llama; Kimi INT4 with its remote-code tokenizer; the K2.5 wrapper layout).
@pytest.mark.parametrize("name", sampled(TINY, keep=["tiny-llama", "tiny-kimi-int4", "tiny-k25-int4-8l"]))
def test_rebuild_into_another_root_is_byte_identical(root, name, tmp_path):
    a, b = root / name, ensure_model(name, tmp_path)
    digests_a, digests_b = _sha256s(a), _sha256s(b)
    assert MARKER in digests_a and "model.safetensors" in digests_a
    assert "tokenizer.json" in digests_a or "tiktoken.model" in digests_a
    assert digests_a == digests_b
    for rel in digests_a:  # nothing in the files may depend on where they were built
        for where in (root, tmp_path):
            assert str(where).encode() not in (b / rel).read_bytes(), f"{name}/{rel} contains its build path"


# --- the INT4 checkpoint -----------------------------------------------------------------------------------------


def test_int4_checkpoint_has_compressed_tensors_layout(root):
    q, twin = _tensors(root / "tiny-kimi-int4"), _tensors(root / "tiny-kimi-bf16")
    experts = sorted({k.rsplit(".", 1)[0] for k in twin if int4.ROUTED_EXPERT_RE.match(k.rsplit(".", 1)[0])})
    assert len(experts) == NUM_MOE_LAYERS * NUM_EXPERTS * 3
    for module in experts:
        out_features, in_features = twin[f"{module}.weight"].shape
        assert f"{module}.weight" not in q
        assert q[f"{module}.weight_packed"].dtype == torch.int32
        assert q[f"{module}.weight_packed"].shape == (out_features, in_features // 8)
        assert q[f"{module}.weight_scale"].dtype == torch.bfloat16
        assert q[f"{module}.weight_scale"].shape == (out_features, in_features // 32)
        assert q[f"{module}.weight_shape"].tolist() == [out_features, in_features]
    unquantized = {k for k in q if not k.endswith(int4.PACKED_SUFFIXES)}
    assert unquantized == {k for k in twin if k.rsplit(".", 1)[0] not in experts}
    for k in unquantized:  # attention, shared experts, dense MLP, router, norms, embeddings, lm_head: untouched
        assert q[k].dtype == twin[k].dtype and torch.equal(q[k], twin[k]), k
    assert any("shared_experts" in k for k in unquantized) and "lm_head.weight" in unquantized
    assert any(".self_attn." in k for k in unquantized) and "model.layers.0.mlp.gate_proj.weight" in unquantized


def test_int4_quantization_config_is_kimis(root):
    from compressed_tensors.quantization import QuantizationConfig

    config = json.loads((root / "tiny-kimi-int4" / "config.json").read_text())
    qc = config["quantization_config"]
    assert qc == int4.KIMI_QUANTIZATION_CONFIG
    assert (qc["quant_method"], qc["format"], qc["quantization_status"]) == (
        "compressed-tensors", "pack-quantized", "compressed")
    weights = qc["config_groups"]["group_0"]["weights"]
    assert (weights["num_bits"], weights["type"], weights["symmetric"]) == (4, "int", True)
    assert (weights["strategy"], weights["group_size"]) == ("group", 32)
    assert qc["ignore"][0] == "lm_head" and len(qc["ignore"]) == 4
    QuantizationConfig.model_validate(qc)
    for twin in ("tiny-kimi-bf16", "tiny-kimi-bf16-defaultrope"):
        assert "quantization_config" not in json.loads((root / twin / "config.json").read_text())


def test_bf16_twin_holds_exactly_the_dequantized_experts(root):
    q, twin = _tensors(root / "tiny-kimi-int4"), _tensors(root / "tiny-kimi-bf16")
    for key in (k for k in q if k.endswith(".weight_packed")):
        module = key.removesuffix(".weight_packed")
        packed = {s: q[f"{module}.{s}"] for s in int4.PACKED_SUFFIXES}
        # Equal whether an engine dequantizes in bf16 or in fp32 (the scales are chosen so that it is exact).
        for dtype in (None, torch.float32):
            assert torch.equal(int4.decompress_weight(packed, dtype).float(), twin[f"{module}.weight"].float()), module


def test_ignore_list_must_select_routed_experts_only():
    weight = torch.zeros(64, 64, dtype=torch.bfloat16)
    tensors = {"model.layers.1.mlp.experts.0.up_proj.weight": weight, "model.layers.1.mlp.extra_proj.weight": weight}
    with pytest.raises(ValueError, match="extra_proj"):
        int4.quantize_experts(tensors)


# --- loading and running -----------------------------------------------------------------------------------------


def test_hf_loads_int4_with_experts_equal_to_the_twin(root):
    q_model, twin_model = _load(root / "tiny-kimi-int4"), _load(root / "tiny-kimi-bf16")
    q_state, twin_state = q_model.state_dict(), twin_model.state_dict()
    assert q_state.keys() == twin_state.keys()
    for k in q_state:
        assert q_state[k].dtype == twin_state[k].dtype and torch.equal(q_state[k], twin_state[k]), k
    assert any(k.endswith("experts.gate_up_proj") for k in q_state)


def test_int4_forward_equals_twin_in_fp32(root):
    ids = _chat_ids(root / "tiny-kimi-bf16")
    q_model = _load(root / "tiny-kimi-int4", dtype=torch.float32)
    # Trap: with dtype=float32, transformers 5.19 leaves the dequantized INT4 experts in bf16 (the scale dtype) and
    # the outputs then drift by up to ~20% from a real fp32 run; an fp32 reference must upcast them itself.
    for p in q_model.parameters():
        p.data = p.data.float()
    twin_model = _load(root / "tiny-kimi-bf16", dtype=torch.float32)
    with torch.no_grad():
        q_out = q_model(ids, output_hidden_states=True)
        twin_out = twin_model(ids, output_hidden_states=True)
    for q_h, twin_h in zip(q_out.hidden_states, twin_out.hidden_states):
        assert torch.equal(q_h, twin_h)
    assert torch.equal(q_out.logits, twin_out.logits)


@pytest.mark.parametrize("name", TINY)
def test_forward_fp32_is_finite_and_well_conditioned(root, name):
    ids = _chat_ids(root / name)
    model = _load(root / name, dtype=torch.float32)
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
    states = [h[0] for h in out.hidden_states]  # boundaries 0..N-1, then the post-norm final
    num_layers = model.config.num_hidden_layers
    assert len(states) == num_layers + 1
    # The residual stream's RMS grows with depth (~sqrt of the layers added); late layers of a deep stack move it
    # relatively less. Bounds for the 8-layer recipes, widened by depth for the 61-layer K2.5 ones.
    max_rms, max_step = (10, 0.99) if num_layers <= 8 else (16, 0.998)
    assert all(torch.isfinite(h).all() for h in states) and torch.isfinite(out.logits).all()
    for b, h in enumerate(states):
        rms = h.pow(2).mean().sqrt().item()
        unit = torch.nn.functional.normalize(h, dim=-1)
        cross_position = (unit @ unit.T)[~torch.eye(len(h), dtype=torch.bool)].mean().item()
        assert 0.5 < rms < max_rms, f"boundary {b}: rms={rms:.3f}"
        assert cross_position < 0.5, f"boundary {b}: positions collapse (mean cosine {cross_position:.3f})"
        if 0 < b < len(states) - 1:  # every layer moves the stream, none scrambles it
            step = torch.nn.functional.cosine_similarity(h, states[b - 1], dim=-1).mean().item()
            assert 0.3 < step < max_step, f"boundary {b}: cosine to boundary {b - 1} is {step:.3f}"
    probs = out.logits[0].softmax(-1)
    entropy = -(probs * probs.clamp_min(1e-30).log()).sum(-1).mean().item()
    assert 0.5 < entropy < 7.0, f"mean next-token entropy {entropy:.2f} nats"


def test_noaux_tc_bias_changes_expert_choice(root):
    model = _load(root / "tiny-kimi-bf16", dtype=torch.float32)
    changed = []

    def hook(router, inputs, _output):
        x = inputs[0].reshape(-1, router.hidden_dim).float()
        scores = (x @ router.weight.float().T).sigmoid()
        with_bias = (scores + router.e_score_correction_bias).topk(router.top_k, -1).indices.sort(-1).values
        without = scores.topk(router.top_k, -1).indices.sort(-1).values
        changed.append((with_bias != without).any(-1).float().mean().item())

    for layer in model.model.layers[1:]:
        assert layer.mlp.gate.e_score_correction_bias.abs().min() > 0
        layer.mlp.gate.register_forward_hook(hook)
    with torch.no_grad():
        model(_chat_ids(root / "tiny-kimi-bf16"))
    assert len(changed) == NUM_MOE_LAYERS and min(changed) > 0.05, changed


# --- configs -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", KIMI)
def test_kimi_config_keys(root, name):
    from transformers import AutoConfig

    raw = json.loads((root / name / "config.json").read_text())
    assert raw["architectures"] == ["DeepseekV3ForCausalLM"]
    assert (raw["moe_layer_freq"], raw["topk_method"], raw["scoring_func"]) == (1, "noaux_tc", "sigmoid")
    assert (raw["kv_lora_rank"], raw["qk_rope_head_dim"], raw["num_hidden_layers"]) == (512, 64, 8)
    assert (raw["n_routed_experts"], raw["num_experts_per_tok"], raw["n_shared_experts"]) == (8, 2, 1)
    loaded = AutoConfig.from_pretrained(str(root / name))
    if name.endswith("defaultrope"):
        assert raw["rope_scaling"] is None and raw["rope_parameters"]["rope_type"] == "default"
        assert loaded.rope_parameters["rope_type"] == "default"
    else:
        # Kimi-K2's own values, in Kimi's legacy form and in the form transformers 5 reads back.
        yarn = {"factor": 32.0, "original_max_position_embeddings": 4096, "beta_fast": 1.0, "beta_slow": 1.0,
                "mscale": 1.0, "mscale_all_dim": 1.0}
        assert raw["rope_scaling"] == {"type": "yarn", **yarn} and raw["rope_theta"] == 50000.0
        assert {k: loaded.rope_parameters[k] for k in yarn} == yarn
        assert loaded.rope_parameters["rope_type"] == "yarn" and loaded.rope_parameters["rope_theta"] == 50000.0


@pytest.mark.parametrize("name", TINY)
def test_special_token_ids_agree_with_tokenizer(root, name):
    tok = _tokenizer(root / name)
    expected = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    assert expected["eos_token_id"] is not None and len(tok) <= 4096
    for file in ("config.json", "generation_config.json"):
        written = json.loads((root / name / file).read_text())
        assert {k: written.get(k) for k in expected} == expected, file


# --- caching -----------------------------------------------------------------------------------------------------


def _stamp(model_dir: Path) -> tuple[int, int]:
    stat = (model_dir / "model.safetensors").stat()
    return stat.st_ino, stat.st_mtime_ns


def test_ensure_model_caches_and_rebuilds_incomplete_dirs(tmp_path):
    path = ensure_model("tiny-llama", tmp_path)
    assert path == tmp_path / "tiny-llama" and is_complete(path, "tiny-llama")
    first = _stamp(path)
    assert ensure_model("tiny-llama", tmp_path) == path and _stamp(path) == first  # cached: not rebuilt
    reference = _sha256s(path)

    damages = {
        "missing marker": lambda: (path / MARKER).unlink(),
        "invalid marker": lambda: (path / MARKER).write_text("{not json"),
        "stale digest": lambda: (path / MARKER).write_text(
            json.dumps({**json.loads((path / MARKER).read_text()), "builder_digest": "0" * 64})),
        "truncated weights": lambda: os.truncate(path / "model.safetensors", 1000),
        "one flipped byte": lambda: _flip_last_byte(path / "model.safetensors"),  # same size (#35 item 14)
    }
    for what, damage in damages.items():
        before = _stamp(path)
        damage()
        assert not is_complete(path, "tiny-llama"), what
        assert ensure_model("tiny-llama", tmp_path) == path
        assert _stamp(path) != before, f"{what}: not rebuilt"
        assert _sha256s(path) == reference, f"{what}: rebuilt differently"
    assert not list(tmp_path.glob(".tiny-llama.building-*"))  # the temporary build directory was renamed away


def _flip_last_byte(path: Path) -> None:
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 0xFF]))


def test_killed_build_leaves_nothing_that_looks_complete(tmp_path):
    stale = tmp_path / ".tiny-llama.building-dead"
    stale.mkdir()
    (stale / "config.json").write_text("{}")  # what a build killed halfway leaves behind
    assert not is_complete(tmp_path / "tiny-llama", "tiny-llama")
    ensure_model("tiny-llama", tmp_path)
    assert not stale.exists()


def test_concurrent_builds_of_one_model_build_it_once(tmp_path):
    command = [sys.executable, "-m", "pipeline.factory", "--root", str(tmp_path), "tiny-llama"]
    procs = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    statuses = sorted(line.split("\t")[2] for line in outputs)
    assert statuses[0].startswith("built in") and statuses[1] == "cached", outputs
    assert is_complete(tmp_path / "tiny-llama", "tiny-llama")


def test_unknown_name_is_rejected(tmp_path):
    with pytest.raises(ValueError, match=r"name='tiny-gpt'.*tiny-kimi-int4"):
        ensure_model("tiny-gpt", tmp_path)
    with pytest.raises(SystemExit):
        main(["--root", str(tmp_path), "tiny-gpt"])


def test_cli_prints_one_line_per_model_and_is_cached_the_second_time(tmp_path, capsys):
    assert main(["--root", str(tmp_path), "tiny-llama"]) == 0
    assert main(["--root", str(tmp_path), "tiny-llama"]) == 0
    first, second = capsys.readouterr().out.strip().splitlines()
    assert first.split("\t")[:2] == ["tiny-llama", str(tmp_path / "tiny-llama")]
    assert second.split("\t") == ["tiny-llama", str(tmp_path / "tiny-llama"), "cached"]


def test_models_root(monkeypatch, tmp_path):
    monkeypatch.setenv("PIPELINE_MODELS_DIR", str(tmp_path))
    assert built.models_root() == tmp_path
    monkeypatch.delenv("PIPELINE_MODELS_DIR")
    assert built.models_root() == Path(__file__).resolve().parents[2] / ".cache" / "models"
