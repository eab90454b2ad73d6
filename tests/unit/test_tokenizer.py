"""The tiny tokenizer: Kimi-style specials and chat template, assistant mask, byte-identical rebuilds."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from pipeline.data.prepare import prepare
from pipeline.factory.tokenizer import (
    DEFAULT_SYSTEM_PROMPT,
    MAX_VOCAB_SIZE,
    SPECIAL_TOKENS,
    build_tokenizer,
    bundled_conversations_path,
)
from tests.helpers import REPO


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tok")
    build_tokenizer(out)
    return out


@pytest.fixture(scope="module")
def tok(tok_dir):
    return AutoTokenizer.from_pretrained(str(tok_dir))


def _digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def test_vocab_within_limit(tok):
    assert len(tok) <= MAX_VOCAB_SIZE
    assert len(tok) > 1000  # a trained vocabulary, not just the byte alphabet


def test_special_tokens_are_single_ids(tok):
    for text in SPECIAL_TOKENS:
        ids = tok.encode(text, add_special_tokens=False)
        assert len(ids) == 1, (text, ids)
        assert ids[0] in tok.all_special_ids
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("[BOS]", "[EOS]", "[PAD]")
    assert len({tok.bos_token_id, tok.eos_token_id, tok.pad_token_id}) == 3


def test_specials_inside_text_are_not_split(tok):
    ids = tok.encode("a<|im_end|>b", add_special_tokens=False)
    assert tok.convert_tokens_to_ids("<|im_end|>") in ids
    assert tok.decode(ids) == "a<|im_end|>b"


def test_plain_text_gets_no_special_tokens_and_round_trips(tok):
    text = "Grüße, 世界! def f(x): return x ** 2"
    ids = tok(text)["input_ids"]
    assert not set(ids) & set(tok.all_special_ids)
    assert tok.decode(ids) == text


def test_chat_template_renders_kimi_format(tok):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
    ]
    assert tok.apply_chat_template(messages, tokenize=False) == (
        "<|im_system|>system<|im_middle|>Be brief.<|im_end|>"
        "<|im_user|>user<|im_middle|>Hi<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|>Hello!<|im_end|>"
    )


def test_chat_template_default_system_and_generation_prompt(tok):
    rendered = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert rendered == (
        f"<|im_system|>system<|im_middle|>{DEFAULT_SYSTEM_PROMPT}<|im_end|>"
        "<|im_user|>user<|im_middle|>Hi<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|>"
    )


def test_generation_mask_is_assistant_content_plus_im_end(tok):
    messages = [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "It is 4."},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "Six."},
    ]
    out = tok.apply_chat_template(messages, return_dict=True, return_assistant_tokens_mask=True)
    masked = [i for i, m in zip(out["input_ids"], out["assistant_masks"]) if m]
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    expected = [
        *tok.encode("It is 4.", add_special_tokens=False), im_end, *tok.encode("Six.", add_special_tokens=False), im_end
    ]
    assert masked == expected


def test_rebuild_is_byte_identical(tok_dir, tmp_path):
    """Same files, same bytes, also from a fresh process with another hash seed."""
    script = (
        "import sys; from pathlib import Path; from pipeline.factory.tokenizer import build_tokenizer; "
        "build_tokenizer(Path(sys.argv[1]))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    subprocess.run([sys.executable, "-c", script, str(tmp_path / "again")], check=True, cwd=REPO, env=env)
    assert _digests(tmp_path / "again") == _digests(tok_dir)
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(_digests(tok_dir))


def test_saved_files_hold_no_paths_or_timestamps(tok_dir):
    for path in tok_dir.iterdir():
        text = path.read_text(encoding="utf-8")
        assert str(tok_dir) not in text and str(REPO) not in text, path.name
        assert "name_or_path" not in text, path.name
    config = json.loads((tok_dir / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"  # loadable by transformers 4.x as well


def test_bundled_set_is_valid_and_varied(tok):
    data = prepare(bundled_conversations_path(), tok, max_length=8192, length_policy="reject")
    assert data.rejects == []
    assert len(data.samples) >= 64
    records = [json.loads(line) for line in bundled_conversations_path().read_text(encoding="utf-8").splitlines()]
    num_assistant = [sum(m["role"] == "assistant" for m in r["messages"]) for r in records]
    assert max(num_assistant) >= 3 and num_assistant.count(1) >= 32
    assert sum(r["messages"][0]["role"] == "system" for r in records) >= 5
    texts = ["".join(m["content"] for m in r["messages"]) for r in records]
    assert sum(any("\u0400" <= c <= "\u04ff" or c >= "\u3040" for c in text) for text in texts) >= 3  # CJK, Cyrillic
    assert max(s.num_tokens for s in data.samples) >= 500
