"""Regeneration in Kimi-K2.5's layout (the tiny K2.5 checkpoint, its own remote-code tokenizer and template): a turn's
generated reasoning stays in its ids while the next prompt renders it as serving does (stripped); tool calls are
paired with the record's results or end the conversation. The answers come from `hf-scripted` (the real HF engine
writing given text: a tiny random model never reasons or calls tools); prompts, template, history and storage are
the pipeline's own."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from pipeline.config import register_configs
from pipeline.data.mask import encode_chat
from pipeline.data.remote_code import load_tokenizer
from pipeline.regen.job import run_regenerate
from tests.conftest import CONF
from tests.helpers.faulty_engines import registered

pytestmark = pytest.mark.integration

REASONING, ANSWER = "The user wants a sum. Two plus two is four.", "4"
CALL = ('<|tool_calls_section_begin|><|tool_call_begin|>functions.add:0<|tool_call_argument_begin|>{"a": 2, "b": 2}'
        '<|tool_call_end|><|tool_calls_section_end|>')
RECORD_CALL = {"id": "functions.add:0", "type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 2}}}
TOOL_RECORD = {"messages": [
    {"role": "user", "content": "Add 2 and 2 with the tool."},
    {"role": "assistant", "content": "", "tool_calls": [RECORD_CALL]},
    {"role": "tool", "tool_call_id": "functions.add:0", "content": "4"},
    {"role": "assistant", "content": "It is 4."}],
    "tools": [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]}


def regenerate(tmp_path: Path, records: list[dict], turns: list[str], name: str) -> Path:
    data = tmp_path / f"{name}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / name
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="regenerate", overrides=[
            "model=tiny_k25_int4_8l", "model.trust_remote_code=true", "engine.name=hf-scripted",
            f"data.path={data}", f"out_dir={out}"])
    GlobalHydra.instance().clear()
    cfg.engine.options = {"turns": turns}  # text with quotes and braces: past Hydra's override grammar
    with registered():
        run_regenerate(cfg)
    return out


def rows(root: Path) -> list[dict]:
    manifest = json.loads((root / "manifest.json").read_text())
    return [r for p in manifest["parts"] for r in pq.read_table(root / p["file"]).to_pylist()]


@pytest.fixture(scope="module")
def tokenizer(models_root, tiny_model):
    return load_tokenizer(tiny_model("tiny-k25-int4-8l"), True)


def test_reasoning_stays_in_the_ids_where_re_rendering_loses_it(tmp_path, tokenizer):
    record = {"messages": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "x"},
                           {"role": "user", "content": "And 3+3?"}, {"role": "assistant", "content": "y"}]}
    said = [f"{REASONING}</think>{ANSWER}<|im_end|>", "Three and three.</think>6<|im_end|>"]
    out = regenerate(tmp_path, [record], said, "think")
    (row,) = rows(out)
    first, second = row["turns"]
    reasoning = tokenizer(REASONING, add_special_tokens=False)["input_ids"]
    think_end = tokenizer.convert_tokens_to_ids("</think>")
    assert first["prompt_ids"][-1] == tokenizer.convert_tokens_to_ids("<think>")  # the generation prompt opens it
    assert first["output_ids"][:len(reasoning) + 1] == reasoning + [think_end]  # kept, as generated
    # The next prompt holds the first answer as serving renders history: its reasoning stripped.
    history = json.loads(second["messages"])
    assert history[1] == {"role": "assistant", "content": ANSWER, "reasoning_content": REASONING}
    assert second["prompt_ids"] == encode_chat(tokenizer, history, True)
    assert _contains(first["prompt_ids"] + first["output_ids"], reasoning)
    assert not _contains(second["prompt_ids"], reasoning)
    # What a text-only pipeline would train on: the whole conversation re-rendered, every reasoning dropped.
    conversation = history + [{"role": "assistant", "content": "6", "reasoning_content": "Three and three."}]
    assert not _contains(encode_chat(tokenizer, conversation, False), reasoning)
    from pipeline.data.regeneration import read_regenerated

    data = read_regenerated(out, tokenizer, max_length=4096, length_policy="truncate", limit=None,
                            train_think_tags=False)
    sample = data.samples[0]
    assert sample.input_ids_T.tolist() == first["prompt_ids"] + first["output_ids"]
    trained = [i for i, m in zip(sample.input_ids_T.tolist(), sample.loss_mask_T.tolist()) if m]
    assert trained == first["output_ids"]  # the reasoning, </think>, the answer and <|im_end|>: all generated


def test_a_matching_tool_call_is_paired_with_the_recorded_result(tmp_path):
    said = [f"I will call it.</think>{CALL}<|im_end|>", "Done.</think>The sum is 4.<|im_end|>"]
    (row,) = rows(regenerate(tmp_path, [TOOL_RECORD], said, "tools"))
    assert row["end_reason"] == "complete" and len(row["turns"]) == 2
    history = json.loads(row["turns"][1]["messages"])
    assert [m["role"] for m in history] == ["user", "assistant", "tool"]
    assert history[1]["tool_calls"] == [RECORD_CALL] and history[2]["content"] == "4"


def test_another_tool_call_ends_the_conversation_with_the_reason(tmp_path):
    other = CALL.replace('"b": 2', '"b": 3')
    (row,) = rows(regenerate(tmp_path, [TOOL_RECORD], [f"Hm.</think>{other}<|im_end|>"], "mismatch"))
    assert row["end_reason"] == "tool_call_mismatch" and len(row["turns"]) == 1
    assert "called [add], the record called [add]" in row["end_detail"]


def _contains(ids: list[int], part: list[int]) -> bool:
    return any(ids[i:i + len(part)] == part for i in range(len(ids) - len(part) + 1))
