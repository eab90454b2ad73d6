"""Data preparation with the Kimi-style remote-code tokenizer: loss masks found by the turn ids (multi-turn, system,
tool calls, reasoning), the mask options, media rejects, and remote code refused unless model.trust_remote_code."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipeline.config import ConfigError, to_config
from pipeline.config.checks import resolve_model
from pipeline.data.mask import ChatTokenizer, MaskOptions
from pipeline.data.prepare import prepare, read_rejects, write_rejects
from pipeline.data.remote_code import RemoteCodeError, load_tokenizer
from pipeline.data.sources import Parsed, parse_record
from tests.helpers.cli import cli

DEFAULT_SYSTEM = "You are Kimi, an AI assistant created by Moonshot AI."
MULTI_TURN = [
    {"role": "user", "content": "Name a prime."},
    {"role": "assistant", "content": "Seven."},
    {"role": "user", "content": "Another one?"},
    {"role": "assistant", "content": "Eleven, a palindrome too."},
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}}}}}]
CALL = {"id": "functions.get_weather:0", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}
CALL_TEXT = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
             "{\"city\": \"Paris\"}<|tool_call_end|><|tool_calls_section_end|>")
TOOL_CHAT = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "18C, clear"},
    {"role": "assistant", "content": "18 degrees and clear."},
]


@pytest.fixture(scope="module")
def tok(kimi_dir):
    return load_tokenizer(kimi_dir, trust_remote_code=True)


def masked(tok, messages, tools=None, **options) -> str:
    """The trained tokens as text, after checking that the ids are exactly the template's text, encoded."""
    ids, mask = ChatTokenizer(tok, MaskOptions(**options)).tokenize(Parsed(messages=messages, tools=tools))
    rendered = tok.apply_chat_template(messages, tools=tools, tokenize=False)
    assert ids == tok(rendered, add_special_tokens=False)["input_ids"]
    assert len(mask) == len(ids) and set(mask) <= {0, 1}
    return tok.decode([i for i, m in zip(ids, mask) if m])


def test_the_mask_is_found_by_special_ids(tok):
    assert ChatTokenizer(tok).method == "special_ids"


def test_multi_turn_trains_each_answer_and_its_end(tok):
    assert masked(tok, MULTI_TURN) == "Seven.<|im_end|>Eleven, a palindrome too.<|im_end|>"


def test_think_tags_are_trained_only_when_asked(tok):
    assert masked(tok, MULTI_TURN, train_think_tags=True) == (
        "<think></think>Seven.<|im_end|><think></think>Eleven, a palindrome too.<|im_end|>")


def test_injected_default_system_is_trained_only_when_asked(tok):
    assert masked(tok, MULTI_TURN, train_default_system=True) == (
        f"{DEFAULT_SYSTEM}<|im_end|>Seven.<|im_end|>Eleven, a palindrome too.<|im_end|>")
    own_system = [{"role": "system", "content": "Answer briefly."}, *MULTI_TURN]
    # A system turn of the conversation's own is input, never trained, whatever the option says.
    assert masked(tok, own_system, train_default_system=True) == masked(tok, own_system) == (
        "Seven.<|im_end|>Eleven, a palindrome too.<|im_end|>")


def test_tool_calls_are_trained_and_tool_results_are_not(tok):
    assert masked(tok, TOOL_CHAT, TOOLS) == f"{CALL_TEXT}<|im_end|>18 degrees and clear.<|im_end|>"
    rendered = tok.apply_chat_template(TOOL_CHAT, tools=TOOLS, tokenize=False)
    assert rendered.startswith("<|im_system|>tool_declare<|im_middle|>[{\"type\":\"function\"")
    assert "<|im_system|>tool<|im_middle|>## Return of functions.get_weather:0\n18C, clear<|im_end|>" in rendered


def test_reasoning_in_the_agentic_tail_is_trained_with_its_closing_tag(tok):
    """After the last plain answer, assistant turns keep their reasoning; the model generates it and </think>,
    while the opening <think> is the generation prompt's."""
    tail = [TOOL_CHAT[0], {**TOOL_CHAT[1], "reasoning_content": "Need the weather."}, TOOL_CHAT[2]]
    assert masked(tok, tail, TOOLS) == f"Need the weather.</think>{CALL_TEXT}<|im_end|>"
    assert masked(tok, tail, TOOLS, train_think_tags=True) == f"<think>Need the weather.</think>{CALL_TEXT}<|im_end|>"


def test_records_with_tool_fields_parse_into_the_template(tok, tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"messages": TOOL_CHAT, "tools": TOOLS}) + "\n")
    sample = prepare(path, tok, max_length=4096, length_policy="truncate").samples[0]
    ids = tok.apply_chat_template(TOOL_CHAT, tools=TOOLS, tokenize=True, return_dict=True)["input_ids"]
    assert sample.input_ids_T.tolist() == list(ids)
    assert parse_record({"messages": TOOL_CHAT, "tools": TOOLS}).tools == TOOLS


def test_a_turn_token_inside_an_answer_is_rejected_with_a_reason(tok, tmp_path):
    bad = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "see <|im_user|> here"}]
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"messages": bad}) + "\n" + json.dumps({"messages": MULTI_TURN}) + "\n")
    data = prepare(path, tok, max_length=4096, length_policy="truncate")
    assert [r.reason for r in data.rejects] == ["template_structure"] and [s.row for s in data.samples] == [1]


MEDIA = [
    {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "a.png"}},
                                               {"type": "text", "text": "What is it?"}]},
                  {"role": "assistant", "content": "A cat."}]},
    {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]},
                  {"role": "assistant", "content": "Hello."}]},
    {"conversations": [{"from": "human", "value": "<image>\nDescribe."}, {"from": "gpt", "value": "A dog."}],
     "image": "dog.jpg"},
]


def test_media_is_rejected_with_a_reason_and_the_rest_is_written(tok, tmp_path):
    good = {"messages": MULTI_TURN}
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [good, *MEDIA, good]))
    data = prepare(path, tok, max_length=4096, length_policy="truncate")
    assert [s.row for s in data.samples] == [0, 4]
    assert [(r.row, r.reason) for r in data.rejects] == [(1, "media_content"), (2, "media_content"),
                                                         (3, "media_content")]
    assert all("text-only" in r.detail for r in data.rejects)
    write_rejects(tmp_path / "rejects.parquet", data.rejects)
    assert read_rejects(tmp_path / "rejects.parquet") == data.rejects


def test_provenance_records_the_mask(tok, tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"messages": MULTI_TURN}) + "\n")
    data = prepare(path, tok, max_length=4096, length_policy="truncate", mask=MaskOptions(train_think_tags=True))
    assert data.loss_mask == {"method": "special_ids", "train_default_system": False, "train_think_tags": True}


# --- remote code --------------------------------------------------------------------------------------------------

def test_the_tokenizer_is_refused_without_trust_remote_code_naming_the_setting(kimi_dir):
    with pytest.raises(RemoteCodeError) as e:
        load_tokenizer(kimi_dir, trust_remote_code=False)
    message = str(e.value)
    assert "model.trust_remote_code=true" in message and "tokenization_kimi.py" in message and "\n" not in message


@pytest.fixture
def kimi_checkpoint(kimi_dir, tiny_model, tmp_path) -> Path:
    """A model directory with a real config and the Kimi tokenizer (no weights: the checks come before any load)."""
    out = tmp_path / "kimi"
    shutil.copytree(kimi_dir, out)
    shutil.copy(tiny_model("tiny-kimi-bf16") / "config.json", out / "config.json")
    return out


def test_config_check_names_the_setting(kimi_checkpoint, compose_cfg):
    cfg = to_config(compose_cfg(f"model.path={kimi_checkpoint}", "model.build=null",
                                   "model.trust_remote_code=false"))
    with pytest.raises(ConfigError, match=r"set model\.trust_remote_code=true"):
        resolve_model(cfg.model)
    trusted = to_config(compose_cfg(f"model.path={kimi_checkpoint}", "model.build=null", "model.trust_remote_code=true"))
    assert resolve_model(trusted.model).path == kimi_checkpoint


def test_extract_exits_2_with_one_line_naming_the_setting(kimi_checkpoint, tmp_path):
    proc = cli("pipeline.extract", f"out_dir={tmp_path / 'run'}", f"hydra.run.dir={tmp_path / 'logs'}",
               f"model.path={kimi_checkpoint}", "model.build=null", "model.trust_remote_code=false", "gate.mode=off",
               timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if "model.trust_remote_code" in line]
    assert len(lines) == 1 and "tokenization_kimi.py" in lines[0]
    assert not (tmp_path / "run").exists()


def test_provenance_records_the_setting_and_every_remote_code_file(kimi_checkpoint):
    from pipeline import provenance
    from pipeline.core.io import sha256_file
    from pipeline.models.info import read_model_info

    config = json.loads((kimi_checkpoint / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "configuration_tiny.TinyConfig"}  # its class also exists in transformers
    (kimi_checkpoint / "config.json").write_text(json.dumps(config))
    (kimi_checkpoint / "configuration_tiny.py").write_text("from .tiny_helpers import SIZE\n")
    (kimi_checkpoint / "tiny_helpers.py").write_text("SIZE = 1\n")
    info = read_model_info(kimi_checkpoint)

    trusted = provenance.model_digests(info, "template", trust_remote_code=True)["remote_code"]
    names = ("configuration_tiny.py", "tiny_helpers.py", "tokenization_kimi.py")  # auto_map's, and what they import
    files = {name: sha256_file(kimi_checkpoint / name) for name in names}
    declared = {"config.json": ["configuration_tiny.py"], "tokenizer_config.json": ["tokenization_kimi.py"]}
    assert trusted == {"trust_remote_code": True, "files_sha256": files, "declared": declared, "not_run_sha256": {}}
    # With the setting off none of it runs, and the record says which declared files did not.
    assert provenance.model_digests(info, "template")["remote_code"] == {
        "trust_remote_code": False, "files_sha256": {}, "declared": declared, "not_run_sha256": files}
    prov = {"engine": {k: None for k in ("framework", "framework_version", "dtype", "quantization",
                                         "attention_backend", "parallel")},
            "capture": {"points": [], "sources": []}, "code": {}, "diff": None, "config": {},
            "model": {"model_type": info.model_type, "num_layers": info.num_layers,
                      **provenance.model_digests(info, "template", trust_remote_code=True)}}
    compact_model = json.loads(provenance.compact(prov)["model"])
    assert compact_model["trust_remote_code"] is True and len(compact_model["remote_code_sha256"]) == 64
    assert "remote_code_not_run_sha256" not in compact_model
    prov["model"].update(provenance.model_digests(info, "template"))
    compact_off = json.loads(provenance.compact(prov)["model"])
    assert compact_off["trust_remote_code"] is False and len(compact_off["remote_code_not_run_sha256"]) == 64


def test_a_config_class_transformers_lacks_needs_the_setting_too(tmp_path):
    from pipeline.data.remote_code import check_remote_code

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "not_in_transformers",
                                                      "auto_map": {"AutoConfig": "configuration_x.XConfig"}}))
    with pytest.raises(RemoteCodeError, match=r"config\.json auto_map -> configuration_x\.py\); set model\.trust_rem"):
        check_remote_code(tmp_path, trust_remote_code=False)
    check_remote_code(tmp_path, trust_remote_code=True)


def test_declared_files_not_run_are_recorded_even_when_they_import_what_is_absent(tmp_path):
    """With the setting off the declared files are only read (transformers' own import regex), never run: a module
    importing a file that is not there, or one that is not UTF-8, is still listed with its digest (None: absent)."""
    from pipeline.core.io import sha256_file
    from pipeline.data.remote_code import remote_code_record

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "auto_map": {
        "AutoConfig": "configuration_x.XConfig", "AutoModelForCausalLM": "modeling_x.XForCausalLM"}}))
    (tmp_path / "configuration_x.py").write_text("from .helpers_x import Y\nraise SystemExit('ran')\n")
    (tmp_path / "modeling_x.py").write_bytes(b"\xff\xfe not utf-8")
    record = remote_code_record(tmp_path, trust_remote_code=False)
    assert record == {"trust_remote_code": False, "files_sha256": {},
                      "declared": {"config.json": ["configuration_x.py", "modeling_x.py"]},
                      "not_run_sha256": {"configuration_x.py": sha256_file(tmp_path / "configuration_x.py"),
                                         "helpers_x.py": None,
                                         "modeling_x.py": sha256_file(tmp_path / "modeling_x.py")}}
