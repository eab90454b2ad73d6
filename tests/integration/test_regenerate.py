"""`python -m pipeline.regenerate` on the real small model (SmolLM2-135M-Instruct) through HF and vLLM, and extract
on its output: the answers are the engine's own greedy continuations of the template-rendered prompt ids, turn by
turn against the target's earlier answers, and extract captures exactly those ids with the loss mask on the
generated tokens."""
from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.helpers import REPO
from tests.helpers.cli import cli

pytestmark = pytest.mark.integration

MAX_TOKENS = 24
ORIGINAL_ANSWER = "ORIGINAL ANSWER FROM THE DATASET, NOT THE TARGET'S"
RECORDS = [
    {"messages": [{"role": "user", "content": "What is the capital of France? Answer in one word."}]},
    {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ORIGINAL_ANSWER},
                  {"role": "user", "content": "What is 2+2? Reply with the number only."},
                  {"role": "assistant", "content": ORIGINAL_ANSWER}]},
    {"prompt": "Write a long story about a dragon."},  # cut at max_tokens: a truncated turn
    {"text": "raw text has no turn to answer"},
    {"system": "You are terse.", "prompt": "Say yes."},
]


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    return path


@pytest.fixture(scope="module")
def smollm2(models_root) -> Path:
    from pipeline.factory.tiny import ensure_model

    return ensure_model("smollm2-135m-instruct", models_root)


def regenerate(out: Path, prompts: Path, *overrides: str) -> subprocess.CompletedProcess:
    return cli("pipeline.regenerate", "model=smollm2", f"data.path={prompts}", f"out_dir={out}",
               f"hydra.run.dir={out}.logs", f"sampling.max_tokens={MAX_TOKENS}", *overrides, timeout=900)


def conversations(root: Path) -> list[dict]:
    manifest = json.loads((root / "manifest.json").read_text())
    return [row for part in manifest["parts"] for row in pq.read_table(root / part["file"]).to_pylist()]


@pytest.fixture(scope="module")
def regen_hf(tmp_path_factory, prompts, smollm2) -> Path:
    out = tmp_path_factory.mktemp("regen") / "hf"
    done = regenerate(out, prompts, "engine=hf", "engine.dtype=float32", "runner.max_samples_per_shard=2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "answers by transformers" in done.stdout and "extract it with: python -m pipeline.extract" in done.stdout
    return out


def test_greedy_answers_are_the_models_own_generate_on_the_same_ids(regen_hf, smollm2):
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    rows = conversations(regen_hf)
    assert [(r["row"], len(r["turns"])) for r in rows] == [(0, 1), (1, 2), (2, 1), (4, 1)]  # input order kept
    for row in rows:
        for turn in row["turns"]:
            ids = torch.tensor([turn["prompt_ids"]])
            with torch.inference_mode():
                plain = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                       max_new_tokens=MAX_TOKENS, eos_token_id=2, pad_token_id=2)
            assert turn["output_ids"] == plain[0, ids.shape[1]:].tolist(), (row["row"], turn["turn"])


def test_each_turn_answers_the_targets_own_history(regen_hf, smollm2):
    import transformers

    from pipeline.data.mask import encode_chat

    tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2)
    (multi,) = [r for r in conversations(regen_hf) if r["row"] == 1]
    first, second = multi["turns"]
    assert first["finish_reason"] == "stop" and first["output_ids"][-1] == tokenizer.eos_token_id
    history = json.loads(second["messages"])
    answer = tokenizer.decode(first["output_ids"][:-1])
    assert [m["role"] for m in history] == ["user", "assistant", "user"]
    assert history[1]["content"] == answer and ORIGINAL_ANSWER not in second["messages"]
    assert second["prompt_ids"] == encode_chat(tokenizer, history, True)  # the template's own rendering
    assert second["prompt_ids"][:len(first["prompt_ids"])] == first["prompt_ids"]
    assert multi["end_reason"] == "complete"


def test_manifest_counts_truncated_turns_and_rejects(regen_hf):
    manifest = json.loads((regen_hf / "manifest.json").read_text())
    rows = conversations(regen_hf)
    cut = [t for r in rows for t in r["turns"] if t["finish_reason"] == "length"]
    assert cut and manifest["truncated"] == {"turns": len(cut), "kept": len(cut), "policy": "keep"}
    assert all(len(t["output_ids"]) == MAX_TOKENS and t["output_ids"][-1] != 2 for t in cut)
    assert manifest["end_reasons"]["truncated"] == len(cut)
    assert manifest["rejects"]["by_reason"] == {"not_a_conversation": 1}
    assert manifest["num_turns"] == sum(len(r["turns"]) for r in rows) == 5
    sampling = manifest["provenance"]["sampling"]
    assert sampling["values"] == {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": MAX_TOKENS}
    assert sampling["stop_token_ids"]["ids"] == [2]
    applied = sampling["applied"][0]["values"]
    assert applied["do_sample"] is False and applied["eos_token_id"] == [2]
    engine = manifest["provenance"]["engine"]
    assert engine["framework"] == "transformers" and engine["dtype"] == "float32"
    assert manifest["provenance"]["model"]["chat_template_sha256"]


def test_extract_captures_exactly_the_generated_ids(regen_hf, tmp_path):
    from pipeline.shards.reader import RunReader

    out = tmp_path / "run"
    done = cli("pipeline.extract", "model=smollm2", f"data.path={regen_hf}", f"out_dir={out}", "gate.mode=off",
               "engine.dtype=float32", f"hydra.run.dir={out}.logs", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "answers by transformers" in done.stdout and "features by transformers" in done.stdout
    turns = [t for r in conversations(regen_hf) for t in r["turns"]]
    with RunReader(out) as run:
        samples = [run.tokens(sid) for sid in run.sample_ids]
    assert len(samples) == len(turns)
    for sample, turn in zip(samples, turns):
        assert sample["input_ids"].tolist() == turn["prompt_ids"] + turn["output_ids"]
        assert sample["loss_mask"].tolist() == [0] * len(turn["prompt_ids"]) + [1] * len(turn["output_ids"])
    manifest = json.loads((out / "manifest.json").read_text())
    chained = manifest["provenance"]["data"]["regeneration"]
    assert chained["manifest_sha256"] == hashlib.sha256((regen_hf / "manifest.json").read_bytes()).hexdigest()
    assert chained["engine"]["framework"] == "transformers"
    assert manifest["provenance"]["loss_mask"]["method"] == "generated_ids"
    assert cli("pipeline.verify", str(out)).returncode == 0


VLLM_PLAIN = """
import json, os, sys
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the EngineCore in this process, as the adapter runs it
os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"  # GiB: the adapter sizes it from the run, never vLLM's default share
from vllm import LLM, SamplingParams

if __name__ == "__main__":
    job = json.load(open(sys.argv[1]))
    llm = LLM(model=job["model"], dtype="float32", enforce_eager=True, max_model_len=2048,
              enable_prefix_caching=False, gpu_memory_utilization=0.1)  # the adapter's default: 0.92 of host memory
                                                                        # fails whenever other jobs hold some
    params = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"], stop_token_ids=[2], detokenize=False)
    outs = llm.generate([{"prompt_token_ids": p} for p in job["prompts"]], params, use_tqdm=False)
    json.dump([list(o.outputs[0].token_ids) for o in outs], open(sys.argv[2], "w"))
"""


def test_vllm_greedy_answers_are_vllms_own_plain_generate(tmp_path, prompts, smollm2, regen_hf):
    out = tmp_path / "vllm"
    done = regenerate(out, prompts, "engine=vllm", "engine.dtype=float32")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = conversations(out)
    turns = [t for r in rows for t in r["turns"]]
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"model": str(smollm2), "max_tokens": MAX_TOKENS,
                               "prompts": [t["prompt_ids"] for t in turns]}))
    script = tmp_path / "plain.py"
    script.write_text(VLLM_PLAIN)
    plain = subprocess.run([str(REPO / ".venv-vllm/bin/python"), str(script), str(job), str(tmp_path / "plain.json")],
                           capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert [t["output_ids"] for t in turns] == json.loads((tmp_path / "plain.json").read_text())
    manifest = json.loads((out / "manifest.json").read_text())
    applied = manifest["provenance"]["sampling"]["applied"][0]["values"]
    assert applied["temperature"] == 0.0 and applied["stop_token_ids"] == [2]
    assert 2 in applied["all_stop_token_ids"]
    hf = [t["output_ids"] for r in conversations(regen_hf) for t in r["turns"]]
    same = sum(a == b for a, b in zip(hf, [t["output_ids"] for t in turns]))
    print(f"vLLM float32 greedy turns equal to HF float32 greedy: {same}/{len(hf)}")


def test_sglang_regenerates_the_same_conversations(tmp_path, prompts, regen_hf):
    """Through SGLang's own scheduler (its greedy ids against SGLang's plain generate: test_sglang_generate.py)."""
    from tests.helpers.markers import skip_without

    skip_without("sglang")
    out = tmp_path / "sglang"
    done = regenerate(out, prompts, "engine=sglang", "engine.dtype=float32", "data.limit=2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "answers by sglang" in done.stdout
    rows = conversations(out)
    assert [(r["row"], len(r["turns"])) for r in rows] == [(0, 1), (1, 2)]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["provenance"]["engine"]["framework"] == "sglang"
    assert cli("pipeline.verify", str(out)).returncode == 0
    hf = [t["output_ids"] for r in conversations(regen_hf)[:2] for t in r["turns"]]
    same = sum(a == b for a, b in zip(hf, [t["output_ids"] for r in rows for t in r["turns"]]))
    print(f"SGLang float32 greedy turns equal to HF float32 greedy: {same}/{len(hf)}")
