"""The SGLang engine's generate task (issue #22) on the real small model, SmolLM2-135M-Instruct, float32.

One generating engine per module (its start is the cost). Greedy output through the pipeline's adapter
(`make_engine(..., task="generate")`, in .venv-sglang's worker) is compared with SGLang's own `sglang.Engine.generate`
called directly on the same prompt ids (a script run in .venv-sglang, written below) and with transformers' greedy
`generate` in this environment; then stop/length finishes and request order in one mixed batch. Figures are printed
(`pytest -s` shows them): decode tokens/s through the adapter.
"""
from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
import torch

from pipeline.core.contracts import FINISH_REASONS, EngineSpec, GenerationRequest, Sampling
from pipeline.engines.base import GenerationUnsupported
from pipeline.engines.registry import REPO_ROOT, make_engine
from pipeline.engines.sglang.generation import sglang_params
from pipeline.factory.packaged import SMOLLM2
from pipeline.points import parse_points
from tests.helpers.markers import SGLANG_PYTHON, skip_without

pytestmark = [pytest.mark.integration]
NEW_TOKENS = 16
QUESTIONS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "What is the difference between a list and a tuple in Python? Answer in two sentences.",
    "Explain what a hash map is to a new programmer.",
]
# SGLang's own serving path, nothing of the adapter's but the CPU layer (activated at import of this main module, as
# SGLang's spawned scheduler re-imports it before SGLang; the layer changes no numerics).
DIRECT = """\
from pipeline.engines.sglang import cpu as sglang_cpu
sglang_cpu.activate_if_cpu_engine()
import json, sys
if __name__ == "__main__":
    import sglang
    model, prompts, new = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    engine = sglang.Engine(model_path=model, dtype="float32", device="cpu", attention_backend="torch_native",
                           disable_cuda_graph=True, skip_tokenizer_init=True, max_total_tokens=4096,
                           log_level="error")
    try:
        outs = engine.generate(input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": new})
        print("RESULT " + json.dumps([o["output_ids"] for o in outs]))
    finally:
        engine.shutdown()
"""


def greedy(max_tokens: int = NEW_TOKENS, **kw) -> Sampling:
    return Sampling(temperature=0.0, max_tokens=max_tokens, **kw)


@pytest.fixture(scope="module")
def smol(tiny_model):
    return tiny_model(SMOLLM2.name)


@pytest.fixture(scope="module")
def prompts(smol) -> list[tuple[int, ...]]:
    """The questions as the model's own chat template renders them (with its default system turn)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smol))
    return [tuple(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                          tokenize=True, return_dict=True)["input_ids"]) for q in QUESTIONS]


@pytest.fixture(scope="module")
def generator(smol):
    skip_without("sglang")
    engine = make_engine(EngineSpec(name="sglang", dtype="float32"), model_path=str(smol), points=[],
                         num_layers=30, task="generate")  # a generating engine captures nothing
    start = time.perf_counter()
    with engine:
        print(f"\nSGLang generate engine started in {time.perf_counter() - start:.1f} s")
        yield engine


@pytest.fixture(scope="module")
def greedy_outputs(generator, prompts):
    requests = [GenerationRequest(request_id=f"q{i}", prompt_ids=p, sampling=greedy()) for i, p in enumerate(prompts)]
    start = time.perf_counter()
    gens = generator.generate(requests)
    seconds = time.perf_counter() - start
    tokens = sum(len(g.output_ids) for g in gens)
    print(f"\nSGLang generate (adapter), SmolLM2 float32, batch {len(requests)}: {tokens} new tokens in "
          f"{seconds:.2f} s = {tokens / seconds:.1f} tok/s ({tokens / len(requests) / seconds:.1f} tok/s per request)")
    return gens


def test_greedy_equals_sglangs_own_generate(smol, prompts, greedy_outputs, tmp_path):
    script = tmp_path / "direct_sglang.py"
    script.write_text(DIRECT)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "SGLANG_USE_CPU_ENGINE": "1"}
    out = subprocess.run([str(SGLANG_PYTHON), str(script), str(smol), json.dumps([list(p) for p in prompts]),
                          str(NEW_TOKENS)], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    (line,) = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    expected = json.loads(line.removeprefix("RESULT "))
    got = [list(g.output_ids) for g in greedy_outputs]
    same = sum(a == b for a, b in zip(got, expected))
    print(f"\ngreedy, SGLang adapter vs sglang.Engine.generate directly: {same} of {len(prompts)} prompts identical")
    assert got == expected


def test_greedy_equals_transformers(smol, prompts, greedy_outputs):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(smol), dtype=torch.float32, attn_implementation="sdpa").eval()
    expected = []
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=NEW_TOKENS)
            expected.append(out[0, len(p):].tolist())
    got = [list(g.output_ids) for g in greedy_outputs]
    same = sum(a == b for a, b in zip(got, expected))
    print(f"\ngreedy, SGLang adapter vs transformers (float32): {same} of {len(prompts)} prompts identical")
    assert got == expected


def test_greedy_reports_what_sglang_applied(greedy_outputs, smol):
    config = json.loads((smol / "config.json").read_text())
    eos = config["eos_token_id"]
    for g in greedy_outputs:
        assert g.finish_reason in FINISH_REASONS
        a = g.applied
        assert a["greedy"] and a["top_k"] == 1 and a["max_new_tokens"] == NEW_TOKENS and not a["ignore_eos"]
        assert a["repetition_penalty"] == 1.0 and a["min_p"] == 0.0 and a["no_stop_trim"]
        assert set([eos] if isinstance(eos, int) else eos) <= set(a["eos_token_ids"])
        assert a["seed"] is None and a["seed_honoured"] is False  # see pipeline/engines/sglang/generation.py


def test_a_mixed_batch_comes_back_in_request_order_with_stop_and_length(generator, prompts, greedy_outputs):
    full = [list(g.output_ids) for g in greedy_outputs]
    stop_id = full[0][5]
    cut = full[0].index(stop_id) + 1  # greedy stops at the first occurrence of the stop id, kept
    requests = [
        GenerationRequest(request_id="stop", prompt_ids=prompts[0], sampling=greedy(stop_token_ids=(stop_id,))),
        GenerationRequest(request_id="short", prompt_ids=prompts[1], sampling=greedy(max_tokens=4)),
        GenerationRequest(request_id="sampled", prompt_ids=prompts[2],
                          sampling=Sampling(temperature=0.8, top_p=0.9, top_k=20, max_tokens=8, seed=7)),
        GenerationRequest(request_id="eight", prompt_ids=prompts[0], sampling=greedy(max_tokens=8)),
    ]
    gens = generator.generate(requests)
    assert [g.request_id for g in gens] == [r.request_id for r in requests]
    stop, short, sampled, eight = gens
    assert stop.finish_reason == "stop" and list(stop.output_ids) == full[0][:cut]
    assert stop.output_ids[-1] == stop_id and stop.applied["stop_token_ids"] == [stop_id]
    assert short.finish_reason == "length" and list(short.output_ids) == full[1][:4]
    assert eight.finish_reason == "length" and list(eight.output_ids) == full[0][:8]
    assert sampled.finish_reason in FINISH_REASONS and 1 <= len(sampled.output_ids) <= 8
    a = sampled.applied
    assert (a["temperature"], a["top_p"], a["top_k"], a["greedy"], a["max_new_tokens"]) == (0.8, 0.9, 20, False, 8)
    assert a["seed"] == 7 and a["seed_honoured"] is False  # passed to SGLang, not sampled with on CPU


def test_info_describes_the_generation_runner(generator):
    info = generator.info()
    assert info.framework == "sglang" and info.dtype == "float32" and info.points == []
    assert info.extra["task"] == "generate" and info.extra["radix_cache"].startswith("disabled")
    assert "sglang.Engine" in info.extra["runner"] and "torch_native" in info.attention_backend
    assert info.parallel["tp"] == 1 and info.quantization["method"] is None


def test_sampling_maps_to_sglangs_conventions():
    params = sglang_params(Sampling(top_k=0, stop_token_ids=(), max_tokens=5, seed=3))
    assert params["top_k"] == -1 and params["stop_token_ids"] is None and params["max_new_tokens"] == 5
    assert params["no_stop_trim"] and params["sampling_seed"] == 3


def test_only_a_generate_engine_generates_and_it_ignores_capture_points(smol):
    """Without starting SGLang: the adapter class itself (constructing it imports no SGLang)."""
    from pipeline.engines.sglang.adapter import SGLangEngine

    spec = EngineSpec(name="sglang", dtype="float32", options={"device": "cpu"})
    capture = SGLangEngine(spec, model_path=str(smol), points=parse_points(["final_norm"], num_layers=30),
                           num_layers=30)
    request = GenerationRequest(request_id="r", prompt_ids=(1, 2, 3), sampling=greedy())
    with pytest.raises(GenerationUnsupported, match="task='capture'.*task='generate'"):
        capture.generate([request])
    # b30, which SGLang cannot capture, would stop a capture engine; a generate engine captures nothing
    generate = SGLangEngine(spec, model_path=str(smol), points=parse_points([30], num_layers=30), num_layers=30,
                            task="generate")
    assert generate.plan is None
