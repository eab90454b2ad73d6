"""Data preparation on crafted files, with the real tiny tokenizer: formats, rejects, masks, length policy, ids."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from pipeline.core.contracts import Reject
from pipeline.data.mask import ChatTokenizer, mask_from_markers, mask_incremental
from pipeline.data.prepare import PreparedData, prepare, write_rejects
from pipeline.data.sources import Parsed, RecordError, check_readable
from pipeline.factory.tokenizer import build_tokenizer, bundled_conversations_path

CHAT = [
    {"role": "system", "content": "You answer in one line."},
    {"role": "user", "content": "Name a prime."},
    {"role": "assistant", "content": "Seven."},
    {"role": "user", "content": "Another one?"},
    {"role": "assistant", "content": "Eleven, and it is also a palindrome."},
]
GOOD = {"messages": CHAT}


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    build_tokenizer(out)
    return AutoTokenizer.from_pretrained(str(out))


@pytest.fixture(scope="module")
def tok_without_markers(tok):
    """The same tokenizer with a template like real Kimi's: no {% generation %} markers."""
    plain = re.sub(r"\{%-?\s*(end)?generation\s*-?%\}", "", tok.chat_template)
    assert plain != tok.chat_template and "endgeneration" not in plain
    copy = AutoTokenizer.from_pretrained(tok.name_or_path)
    copy.chat_template = plain
    return copy


def write_jsonl(path: Path, lines: list) -> Path:
    """Each item is a JSON value, or a str written verbatim (for malformed and blank lines)."""
    text = "".join((line if isinstance(line, str) else json.dumps(line, ensure_ascii=False)) + "\n" for line in lines)
    path.write_text(text, encoding="utf-8")
    return path


def run(path: Path, tok, max_length: int = 4096, length_policy: str = "truncate", **kw) -> PreparedData:
    return prepare(path, tok, max_length=max_length, length_policy=length_policy, **kw)


def expected_chat(tok, messages: list[dict]) -> tuple[list[int], list[int]]:
    """Ids and mask built by hand: the template's text, and 1 exactly on assistant content + <|im_end|>."""
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    ids, mask = tok.encode(tok.apply_chat_template(messages, tokenize=False), add_special_tokens=False), []
    for message in messages if messages[0]["role"] == "system" else [{"role": "system"}, *messages]:
        content = message.get("content", "You are a helpful assistant.")
        header = tok.encode(f"<|im_{message['role']}|>{message['role']}<|im_middle|>", add_special_tokens=False)
        body = [*tok.encode(content, add_special_tokens=False), im_end]
        mask += [0] * len(header) + [int(message["role"] == "assistant")] * len(body)
    return ids, mask


# --- each reject reason, each between two good records that must survive -------------------------------------

IMAGE_PART = [{"type": "image_url", "image_url": {"url": "x.png"}}, {"type": "text", "text": "what is this?"}]
ANSWER = {"role": "assistant", "content": "a"}
REJECT_CASES = [
    ("empty", {}),
    ("empty", {"messages": []}),
    ("empty", {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "  "}]}),
    ("empty", {"prompt": "", "response": "ok"}),
    ("malformed_json", '{"messages": [{"role": "user", "content": "hi"'),
    ("not_an_object", [1, 2, 3]),
    ("not_an_object", '"just a string"'),
    ("unknown_format", {"question": "hi", "answer": "hello"}),
    ("unknown_format", {"messages": "hi"}),
    ("unknown_role", {"messages": [{"role": "robot", "content": "beep"}, {"role": "assistant", "content": "ok"}]}),
    ("unknown_role", {"conversations": [{"from": "narrator", "value": "x"}, {"from": "gpt", "value": "y"}]}),
    ("no_assistant_turn", {"prompt": "Write a poem."}),
    ("no_assistant_turn", {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}),
    ("media_content", {"messages": [{"role": "user", "content": IMAGE_PART}, ANSWER]}),
    ("non_text_content", {"messages": [{"role": "user", "content": 42}, ANSWER]}),
    ("non_text_content", {"text": {"nested": True}}),
]


@pytest.mark.parametrize(("reason", "record"), REJECT_CASES, ids=[f"{r}-{i}" for i, (r, _) in enumerate(REJECT_CASES)])
def test_each_reject_reason(tok, tmp_path, reason, record):
    data = run(write_jsonl(tmp_path / "d.jsonl", [GOOD, record, GOOD]), tok)
    assert [s.row for s in data.samples] == [0, 2]
    assert len(data.rejects) == 1
    reject = data.rejects[0]
    assert (reject.reason, reject.row, reject.source) == (reason, 1, "d.jsonl")
    assert reject.detail and reject.sample_id and len(reject.sample_id) == 16


def test_too_long_under_reject_policy_names_the_length(tok, tmp_path):
    data = run(write_jsonl(tmp_path / "d.jsonl", [GOOD]), tok, max_length=10, length_policy="reject")
    num_tokens = len(expected_chat(tok, CHAT)[0])
    assert data.samples == [] and data.rejects[0].reason == "too_long"
    assert f"{num_tokens} tokens > max_length 10" in data.rejects[0].detail


def test_no_loss_tokens_when_truncation_cuts_every_assistant_token(tok, tmp_path):
    record = {"prompt": "word " * 200, "response": "ok"}
    data = run(write_jsonl(tmp_path / "d.jsonl", [record]), tok, max_length=50, length_policy="truncate")
    assert data.samples == [] and data.rejects[0].reason == "no_loss_tokens"
    assert "first 50 of" in data.rejects[0].detail


def test_truncate_keeps_the_first_max_length_tokens(tok, tmp_path):
    ids, mask = expected_chat(tok, CHAT)
    max_length = len(ids) - 5
    sample = run(write_jsonl(tmp_path / "d.jsonl", [GOOD]), tok, max_length=max_length).samples[0]
    assert sample.truncated and sample.num_tokens == max_length
    assert sample.input_ids_T.tolist() == ids[:max_length] and sample.loss_mask_T.tolist() == mask[:max_length]


def test_fitting_sample_is_not_truncated_under_either_policy(tok, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [GOOD])
    num_tokens = len(expected_chat(tok, CHAT)[0])
    for policy in ("truncate", "reject"):
        sample = run(path, tok, max_length=num_tokens, length_policy=policy).samples[0]
        assert not sample.truncated and sample.num_tokens == num_tokens


# --- formats and masks ----------------------------------------------------------------------------------------

def test_loss_mask_is_exactly_assistant_content_and_im_end(tok, tmp_path):
    sample = run(write_jsonl(tmp_path / "d.jsonl", [GOOD]), tok).samples[0]
    ids, mask = expected_chat(tok, CHAT)
    assert sample.input_ids_T.dtype == np.int64 and sample.loss_mask_T.dtype == np.uint8
    assert sample.input_ids_T.tolist() == ids and sample.loss_mask_T.tolist() == mask
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    masked = sample.input_ids_T[sample.loss_mask_T == 1].tolist()
    assert tok.decode(masked) == "Seven.<|im_end|>Eleven, and it is also a palindrome.<|im_end|>"
    assert masked.count(im_end) == 2


def _bundled_messages() -> list[list[dict]]:
    lines = bundled_conversations_path().read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["messages"] for line in lines if line.strip()]


def test_every_mask_method_agrees_on_the_bundled_set(tok, tok_without_markers):
    """The special-id scan (what prepare uses for Kimi-style tokenizers), the {% generation %} spans and the
    incremental fallback find the same ids and the same assistant tokens."""
    chat = ChatTokenizer(tok)
    assert chat.method == "special_ids" and ChatTokenizer(tok_without_markers).method == "special_ids"
    conversations = _bundled_messages()
    assert len(conversations) >= 64
    for messages in conversations:
        by_ids = chat.tokenize(Parsed(messages=messages))
        assert by_ids == mask_from_markers(tok, messages) == mask_incremental(tok_without_markers, messages)


def test_leading_assistant_turn(tok, tok_without_markers, tmp_path):
    """Kimi-style templates insert a default system turn, so the empty prefix is not a token prefix: the incremental
    fallback says so, while the special ids find the turn."""
    messages = [{"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Hi"}]
    path = write_jsonl(tmp_path / "d.jsonl", [{"messages": messages}, GOOD])
    sample = run(path, tok_without_markers).samples[0]
    assert tok.decode(sample.input_ids_T[sample.loss_mask_T == 1].tolist()) == "Hello!<|im_end|>"
    with pytest.raises(RecordError) as e:
        mask_incremental(tok_without_markers, messages)
    assert e.value.reason == "template_not_incremental"


SHAREGPT_ROLE = {"system": "system", "user": "human", "assistant": "gpt"}
FORMATS = {
    "sharegpt": {"conversations": [{"from": SHAREGPT_ROLE[m["role"]], "value": m["content"]} for m in CHAT]},
    "openai_text_parts": {"messages": [{**m, "content": [{"type": "text", "text": m["content"]}]} for m in CHAT]},
}


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_chat_formats_give_the_same_sample_as_messages(tok, tmp_path, name):
    data = run(write_jsonl(tmp_path / "d.jsonl", [GOOD, FORMATS[name]]), tok)
    a, b = data.samples
    assert np.array_equal(a.input_ids_T, b.input_ids_T) and np.array_equal(a.loss_mask_T, b.loss_mask_T)


@pytest.mark.parametrize("answer_field", ["response", "completion"])
def test_prompt_format(tok, tmp_path, answer_field):
    record = {"system": "Be nice.", "prompt": "Say hi.", answer_field: "Hi!"}
    sample = run(write_jsonl(tmp_path / "d.jsonl", [record]), tok).samples[0]
    messages = [{"role": "system", "content": "Be nice."}, {"role": "user", "content": "Say hi."},
                {"role": "assistant", "content": "Hi!"}]
    assert (sample.input_ids_T.tolist(), sample.loss_mask_T.tolist()) == expected_chat(tok, messages)


def test_text_format_is_raw_text_with_loss_everywhere(tok, tmp_path):
    text = "Plain pretraining text, no chat template.\nSecond line."
    sample = run(write_jsonl(tmp_path / "d.jsonl", [{"text": text}]), tok).samples[0]
    assert sample.input_ids_T.tolist() == tok(text)["input_ids"]
    assert sample.num_loss_tokens == sample.num_tokens > 0


def test_parquet_input_with_mixed_formats(tok, tmp_path):
    rows = [GOOD, {"prompt": "Say hi.", "response": "Hi!"}, {"text": "raw"}, {"prompt": "no answer"}]
    columns = {key: [row.get(key) for row in rows] for key in ("messages", "prompt", "response", "text")}
    pq.write_table(pa.table(columns), tmp_path / "d.parquet")  # a field a row lacks is stored as null
    data = run(tmp_path / "d.parquet", tok)
    jsonl = run(write_jsonl(tmp_path / "d.jsonl", rows), tok)
    assert [s.row for s in data.samples] == [0, 1, 2] and [r.reason for r in data.rejects] == ["no_assistant_turn"]
    for a, b in zip(data.samples, jsonl.samples):
        assert np.array_equal(a.input_ids_T, b.input_ids_T) and np.array_equal(a.loss_mask_T, b.loss_mask_T)


def test_prompt_completion_as_message_lists(tok, tmp_path):
    """TRL's conversational prompt/completion: both fields are lists of role/content messages."""
    record = {"prompt": CHAT[:4], "completion": CHAT[4:]}
    data = run(write_jsonl(tmp_path / "d.jsonl", [GOOD, record]), tok)
    a, b = data.samples
    assert np.array_equal(a.input_ids_T, b.input_ids_T) and np.array_equal(a.loss_mask_T, b.loss_mask_T)


def test_json_files_array_single_object_or_lines(tok, tmp_path):
    (tmp_path / "a.json").write_text(json.dumps([GOOD, {"foo": 1}, GOOD], indent=2), encoding="utf-8")
    data = run(tmp_path / "a.json", tok)
    assert [s.row for s in data.samples] == [0, 2] and data.rejects[0].reason == "unknown_format"
    (tmp_path / "b.json").write_text(json.dumps(GOOD, indent=2), encoding="utf-8")
    assert [s.row for s in run(tmp_path / "b.json", tok).samples] == [0]
    write_jsonl(tmp_path / "c.json", [GOOD, "{oops", GOOD])
    data = run(tmp_path / "c.json", tok)
    assert [s.row for s in data.samples] == [0, 2] and data.rejects[0].reason == "malformed_json"
    (tmp_path / "d.json").write_text("[" + json.dumps(GOOD) + ",", encoding="utf-8")
    with pytest.raises(ValueError, match=r"d\.json: not a valid JSON array"):
        run(tmp_path / "d.json", tok)


# --- reading, ids, limits, rejects file -----------------------------------------------------------------------

def test_good_record_after_malformed_line_survives_and_blank_lines_are_skipped(tok, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ["{not json", "", "   ", GOOD, ""])
    data = run(path, tok)
    assert [(r.row, r.reason) for r in data.rejects] == [(0, "malformed_json")] and "line 1" in data.rejects[0].detail
    assert [s.row for s in data.samples] == [1]


def test_invalid_utf8_line_is_a_reject(tok, tmp_path):
    path = tmp_path / "d.jsonl"
    good = json.dumps(GOOD).encode()
    path.write_bytes(b"\xef\xbb\xbf" + good + b"\n{\"text\": \"caf\xe9\"}\n" + good)
    data = run(path, tok)  # a leading byte-order mark is fine; a Latin-1 byte is not
    assert [s.row for s in data.samples] == [0, 2]
    assert [(r.row, r.reason) for r in data.rejects] == [(1, "malformed_json")] and "UTF-8" in data.rejects[0].detail


def test_sample_ids_are_stable_across_copies_and_change_with_content(tok, tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [GOOD, {"prompt": "x", "response": "y"}])
    (tmp_path / "elsewhere").mkdir()
    copy = shutil.copy(path, tmp_path / "elsewhere" / "renamed.jsonl")
    first, second = run(path, tok), run(Path(copy), tok)
    assert first.source_digest == second.source_digest
    assert [s.sample_id for s in first.samples] == [s.sample_id for s in second.samples]
    assert len({s.sample_id for s in first.samples}) == 2
    changed = run(write_jsonl(tmp_path / "a.jsonl", [GOOD, {"prompt": "x", "response": "z"}]), tok)
    assert not {s.sample_id for s in changed.samples} & {s.sample_id for s in first.samples}


def test_limit_counts_accepted_samples(tok, tmp_path):
    data = run(write_jsonl(tmp_path / "d.jsonl", [GOOD, {}, GOOD, GOOD]), tok, limit=2)
    assert [s.row for s in data.samples] == [0, 2] and len(data.rejects) == 1


def test_bad_options_fail_naming_the_value(tok, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [GOOD])
    with pytest.raises(ValueError, match="'drop'"):
        run(path, tok, length_policy="drop")
    with pytest.raises(ValueError, match="max_length.*0"):
        run(path, tok, max_length=0)


def test_check_readable_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        check_readable(tmp_path / "missing.jsonl")
    (tmp_path / "d.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match=r"d\.csv"):
        check_readable(tmp_path / "d.csv")
    with pytest.raises(ValueError, match="not a regular file"):
        check_readable(tmp_path)
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(ValueError, match="bad.parquet"):
        check_readable(tmp_path / "bad.parquet")


def test_write_rejects_round_trip(tmp_path):
    rejects = [
        Reject(source="d.jsonl", row=3, reason="too_long", detail="812 tokens > max_length 512", sample_id="ab" * 8),
        Reject(source="d.jsonl", row=7, reason="malformed_json", detail="line 9: Expecting value at column 1"),
    ]
    out = tmp_path / "run" / "rejects.parquet"
    write_rejects(out, rejects)
    table = pq.read_table(out)
    assert table.column_names == ["source", "row", "sample_id", "reason", "detail"]
    assert [Reject(**row) for row in table.to_pylist()] == rejects
    assert sorted(p.name for p in out.parent.iterdir()) == ["rejects.parquet"]  # no temp file left
    write_rejects(out, [])
    assert pq.read_table(out).num_rows == 0
