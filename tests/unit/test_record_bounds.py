"""Records bounded before tokenisation (pipeline/data/bounds.py), with the real tiny tokenizers: the character cut under
length_policy=truncate gives the tokens and mask of the whole text, and every per-record failure (a record over the
bound, too deep, a lone surrogate, a template that raises) is that record's reject, the records around it kept."""
from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from pipeline.data.bounds import MAX_JSON_DEPTH, RecordBounds
from pipeline.data.mask import ChatTokenizer
from pipeline.data.prepare import _tokenize, prepare
from pipeline.data.remote_code import load_tokenizer
from pipeline.data.sources import Parsed, parse_record
from pipeline.factory.tokenizer import build_tokenizer

GOOD = {"messages": [{"role": "user", "content": "Name a prime."}, {"role": "assistant", "content": "Seven."}]}
MAX_LENGTH = 64  # small, so that the bounds are a few kB (the default system turn is ~20 tokens)


@pytest.fixture(scope="module", params=["bpe", "kimi"])
def tok(request, tmp_path_factory, kimi_dir):
    """Both tiny tokenizer kinds: a BPE tokenizer (transformers' Rust backend) and Kimi's remote-code tiktoken one."""
    if request.param == "kimi":
        return load_tokenizer(kimi_dir, trust_remote_code=True)
    out = tmp_path_factory.mktemp("tok")
    build_tokenizer(out)
    return AutoTokenizer.from_pretrained(str(out))


def write_jsonl(path: Path, lines: list) -> Path:
    """Each item is a JSON value, or a str written verbatim."""
    text = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    path.write_text(text, encoding="utf-8")
    return path


def _mixed_text(rng: random.Random, num_chars: int) -> str:
    """Words, digits, punctuation, runs without spaces and non-Latin script: every kind of pre-token boundary."""
    pieces = ["prime", " numbers", " 1234567", ",", " 素数です", "\n\n", " aaaaaaaaaaaaaaaaaaaa", "!?", "    x",
              "é"]
    out, size = [], 0
    while size < num_chars:
        piece = rng.choice(pieces)
        out.append(piece)
        size += len(piece)
    return "".join(out)


def _long_records(rng: random.Random, bounds: RecordBounds) -> list[dict]:
    """Records whose rendered text is 1.5 to 4 times the character bound, the cut landing in a user turn, in an
    assistant turn, in reasoning-free history and in a raw text."""
    n = bounds.max_chars
    short = "Seven."
    return [
        {"messages": [{"role": "assistant", "content": short}, {"role": "user", "content": _mixed_text(rng, 3 * n)},
                      {"role": "assistant", "content": short}]},
        {"messages": [{"role": "user", "content": "Say a lot."},
                      {"role": "assistant", "content": _mixed_text(rng, 2 * n)}]},
        {"messages": [m for _ in range(40) for m in ({"role": "user", "content": "Go on."},
                                                      {"role": "assistant", "content": _mixed_text(rng, n // 20)})]},
        {"text": _mixed_text(rng, 4 * n)},
        {"text": "a" * (2 * n)},  # one run of letters: a single pre-token, cut in its middle
    ]


def _whole(tok, record: dict, max_length: int) -> tuple[list[int], list[int]]:
    """What tokenising the whole record and keeping max_length tokens gives (the result before any bound)."""
    ids, mask = ChatTokenizer(tok).tokenize(parse_record(record))
    return ids[:max_length], mask[:max_length]


def test_the_character_cut_keeps_the_tokens_and_mask_of_the_whole_text(tok, tmp_path):
    bounds = RecordBounds.of(tok, MAX_LENGTH)
    records = _long_records(random.Random(0), bounds)
    chat = ChatTokenizer(tok)
    assert all(len(chat.text_of(parse_record(r))) > bounds.max_chars for r in records)
    assert all(_tokenize(chat, parse_record(r), bounds, "truncate")[2] for r in records)  # each one is cut
    assert all(len(json.dumps(r)) < bounds.max_record_bytes for r in records)  # and read
    data = prepare(write_jsonl(tmp_path / "d.jsonl", records), tok, max_length=MAX_LENGTH,
                   length_policy="truncate")
    assert data.rejects == [] and len(data.samples) == len(records)
    for record, sample in zip(records, data.samples):
        ids, mask = _whole(tok, record, MAX_LENGTH)
        assert sample.truncated and sample.input_ids_T.tolist() == ids and sample.loss_mask_T.tolist() == mask
        assert any(mask)


def test_a_cut_that_leaves_no_loss_token_is_no_loss_tokens_as_before(tok, tmp_path):
    bounds = RecordBounds.of(tok, MAX_LENGTH)
    record = {"messages": [{"role": "user", "content": "why " * bounds.max_chars},
                           {"role": "assistant", "content": "ok"}]}
    assert not any(_whole(tok, record, MAX_LENGTH)[1])
    data = prepare(write_jsonl(tmp_path / "d.jsonl", [record]), tok, max_length=MAX_LENGTH, length_policy="truncate")
    assert data.samples == [] and [r.reason for r in data.rejects] == ["no_loss_tokens"]
    assert "in the first 64 of" in data.rejects[0].detail


def test_a_cut_in_an_assistant_turn_trains_what_the_whole_turn_trains(tok, tmp_path):
    """The cut lands inside the answer: the answer's tokens within max_length are trained, as without the cut."""
    bounds = RecordBounds.of(tok, 200)
    record = {"messages": [{"role": "user", "content": "Count."},
                           {"role": "assistant", "content": " ".join(str(i) for i in range(bounds.max_chars))}]}
    sample = prepare(write_jsonl(tmp_path / "d.jsonl", [record]), tok, max_length=200,
                     length_policy="truncate").samples[0]
    ids, mask = _whole(tok, record, 200)
    assert sample.input_ids_T.tolist() == ids and sample.loss_mask_T.tolist() == mask and sum(mask) > 150


def test_over_the_character_bound_under_reject_is_too_long_before_tokenising(tok, tmp_path):
    bounds = RecordBounds.of(tok, MAX_LENGTH)
    long_text = "word " * (bounds.max_chars // 5 + 10)
    data = prepare(write_jsonl(tmp_path / "d.jsonl", [GOOD, {"prompt": long_text, "response": "ok"}, GOOD]), tok,
                   max_length=MAX_LENGTH, length_policy="reject")
    assert [s.row for s in data.samples] == [0, 2]
    (reject,) = data.rejects
    assert reject.reason == "too_long" and "characters rendered, more than max_length 64 tokens" in reject.detail
    assert f"at most {bounds.max_chars:,} characters" in reject.detail


@pytest.mark.parametrize("policy", ["truncate", "reject"])
def test_a_line_over_the_record_bound_is_too_long_with_its_size(tok, tmp_path, policy):
    bounds = RecordBounds.of(tok, MAX_LENGTH)
    big = json.dumps({"text": "x" * (bounds.max_record_bytes + 12345)})
    data = prepare(write_jsonl(tmp_path / "d.jsonl", [GOOD, big, "", GOOD]), tok, max_length=MAX_LENGTH,
                   length_policy=policy)
    assert [s.row for s in data.samples] == [0, 2]
    (reject,) = data.rejects
    assert (reject.reason, reject.row) == ("too_long", 1)
    assert f"line 2: the record is {len(big):,} bytes, more than the {bounds.max_record_bytes:,}" in reject.detail


def test_a_json_array_element_over_the_record_bound_is_too_long(tok, tmp_path):
    bounds = RecordBounds.of(tok, MAX_LENGTH)
    path = tmp_path / "d.json"
    path.write_text(json.dumps([GOOD, {"text": "x" * (bounds.max_record_bytes + 1)}, GOOD]))
    data = prepare(path, tok, max_length=MAX_LENGTH, length_policy="truncate")
    assert [s.row for s in data.samples] == [0, 2] and [r.reason for r in data.rejects] == ["too_long"]


def test_a_parquet_row_over_the_record_bound_is_too_long(tok, tmp_path):
    bounds = RecordBounds.of(tok, MAX_LENGTH)
    path = tmp_path / "d.parquet"
    texts = ["a short text", "x" * (bounds.max_record_bytes + 1), "another short text"]
    pq.write_table(pa.table({"text": texts}), path)
    data = prepare(path, tok, max_length=MAX_LENGTH, length_policy="truncate")
    assert [s.row for s in data.samples] == [0, 2] and [r.reason for r in data.rejects] == ["too_long"]
    assert f"more than the {bounds.max_record_bytes:,} one record may take" in data.rejects[0].detail


def _nested(depth: int) -> str:
    return json.dumps({"messages": GOOD["messages"], "meta": None})[:-5] + "[" * depth + "]" * depth + "}"


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 100_000])
def test_deep_nesting_is_too_deep_in_jsonl_and_in_a_json_array(tok, tmp_path, depth):
    """Deeper than the bound, and deeper than the JSON decoder can follow (a RecursionError, once the run's end)."""
    data = prepare(write_jsonl(tmp_path / "d.jsonl", [GOOD, _nested(depth), GOOD]), tok, max_length=4096,
                   length_policy="truncate")
    assert [s.row for s in data.samples] == [0, 2] and [r.reason for r in data.rejects] == ["too_deep"]
    path = tmp_path / "d.json"
    path.write_text(f"[{json.dumps(GOOD)}, {_nested(depth)}, {json.dumps(GOOD)}]")
    data = prepare(path, tok, max_length=4096, length_policy="truncate")
    assert [s.row for s in data.samples] == [0, 2] and [r.reason for r in data.rejects] == ["too_deep"]


def test_nesting_within_the_bound_is_read(tok, tmp_path):
    data = prepare(write_jsonl(tmp_path / "d.jsonl", [_nested(MAX_JSON_DEPTH - 2)]), tok, max_length=4096,
                   length_policy="truncate")
    assert len(data.samples) == 1 and data.rejects == []


@pytest.mark.parametrize("where", ["content", "reasoning", "text", "tool_args"])
def test_a_lone_surrogate_is_invalid_text(tok, tmp_path, where):
    bad = "broken \\ud800 text"  # the JSON escape of a lone surrogate, as scraped data holds it
    records = {
        "content": '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "%s"}]}',
        "reasoning": '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", '
                     '"reasoning_content": "%s", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}]}',
        # an agentic tail (a last turn that calls tools): its reasoning is rendered
        "text": '{"text": "%s"}',
        "tool_args": '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", '
                     '"tool_calls": [{"function": {"name": "f", "arguments": "%s"}}]}]}',
    }
    data = prepare(write_jsonl(tmp_path / "d.jsonl", [GOOD, records[where] % bad, GOOD]), tok, max_length=4096,
                   length_policy="truncate")
    if where in ("reasoning", "tool_args") and "tool_calls" not in tok.chat_template:
        # The tiny BPE template renders neither: what the tokenizer never sees cannot be wrong for it.
        assert [s.row for s in data.samples] == [0, 1, 2]
        return
    assert [s.row for s in data.samples] == [0, 2]
    (reject,) = data.rejects
    assert reject.reason == "invalid_text" and "lone surrogate U+D800" in reject.detail


def _with_template(tok, extra: str):
    """A copy of `tok` whose chat template first runs `extra` for every message (as real templates check roles)."""
    copy = AutoTokenizer.from_pretrained(tok.name_or_path, trust_remote_code=True)
    copy.chat_template = "{%- for message in messages -%}" + extra + "{%- endfor -%}" + tok.chat_template
    return copy


@pytest.mark.parametrize(("extra", "message"), [
    ("{%- if message['role'] == 'system' and not loop.first -%}{{ raise_exception('system must come first') }}"
     "{%- endif -%}", "system must come first"),
    ("{%- if message['content'].startswith('#') -%}{{ message['content'] - 1 }}{%- endif -%}", "TypeError"),
])
def test_a_template_that_raises_on_one_record_rejects_that_record(tok, tmp_path, extra, message):
    bad = {"messages": [{"role": "user", "content": "#hi"}, {"role": "system", "content": "late"},
                        {"role": "assistant", "content": "ok"}]}
    data = prepare(write_jsonl(tmp_path / "d.jsonl", [GOOD, bad, GOOD]), _with_template(tok, extra),
                   max_length=4096, length_policy="truncate")
    assert [s.row for s in data.samples] == [0, 2]
    (reject,) = data.rejects
    assert reject.reason == "template_error" and message in reject.detail


def test_bounds_come_from_the_vocabulary(tok):
    longest = max(len(token) for token in tok.get_vocab())
    bounds = RecordBounds.of(tok, 100)
    assert bounds.token_chars >= longest and bounds.max_chars == (100 + 64) * bounds.token_chars
    text = "".join(re.sub(r"\s", "", t) for t in tok.get_vocab())[:5000]
    assert len(tok(text, add_special_tokens=False)["input_ids"]) >= len(text) / bounds.token_chars
    assert ChatTokenizer(tok).can_cut(Parsed(text="x"))
