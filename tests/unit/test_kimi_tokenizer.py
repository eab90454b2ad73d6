"""The Kimi-style tokenizer directory: remote code only on request, tiktoken ranks, Kimi's special ids, the template."""
from __future__ import annotations

import hashlib

import pytest
from tiktoken.load import load_tiktoken_bpe
from transformers import AutoTokenizer

from pipeline.factory.kimi_tokenizer import NUM_RANKS, SPECIAL_OFFSETS, VOCAB_SIZE, write_kimi_tokenizer

# Kimi-K2/K2.5's published special ids, minus 163584 (the first id after the BPE ranks).
KIMI_OFFSETS = {"[BOS]": 0, "[EOS]": 1, "<|im_end|>": 2, "<|im_user|>": 3, "<|im_assistant|>": 4,
                "<|start_header_id|>": 6, "<|end_header_id|>": 7, "[EOT]": 9, "<|im_system|>": 10,
                "<|tool_calls_section_begin|>": 11, "<|tool_calls_section_end|>": 12, "<|tool_call_begin|>": 13,
                "<|tool_call_argument_begin|>": 14, "<|tool_call_end|>": 15, "<|im_middle|>": 17,
                "<|media_begin|>": 18, "<|media_content|>": 19, "<|media_end|>": 20, "<|media_pad|>": 21,
                "<think>": 22, "</think>": 23, "[UNK]": 254, "[PAD]": 255}
CHAT = [
    {"role": "user", "content": "Name a prime."},
    {"role": "assistant", "content": "Seven."},
    {"role": "user", "content": "Another one, with <think> in it?"},
]


@pytest.fixture(scope="module")
def kimi_tok(kimi_dir):
    return AutoTokenizer.from_pretrained(str(kimi_dir), trust_remote_code=True)


def test_files_in_kimis_shape(kimi_dir):
    assert sorted(p.name for p in kimi_dir.iterdir()) == [
        "chat_template.jinja", "tiktoken.model", "tokenization_kimi.py", "tokenizer_config.json"]
    ranks = load_tiktoken_bpe(str(kimi_dir / "tiktoken.model"))
    assert sorted(ranks.values()) == list(range(NUM_RANKS))
    assert all(ranks[bytes([b])] == b for b in range(256))


def test_loads_only_with_trust_remote_code(kimi_dir):
    with pytest.raises(ValueError, match="trust_remote_code"):
        AutoTokenizer.from_pretrained(str(kimi_dir), trust_remote_code=False)


def test_special_ids_at_kimis_offsets(kimi_tok):
    assert len(kimi_tok) == VOCAB_SIZE
    for token, offset in KIMI_OFFSETS.items():
        assert kimi_tok.convert_tokens_to_ids(token) == NUM_RANKS + offset, token
        assert kimi_tok.encode(token, add_special_tokens=False) == [NUM_RANKS + offset]
    assert (kimi_tok.bos_token_id, kimi_tok.eos_token_id, kimi_tok.pad_token_id, kimi_tok.unk_token_id) == (
        NUM_RANKS, NUM_RANKS + 1, NUM_RANKS + 255, NUM_RANKS + 254)
    assert {v: k for k, v in SPECIAL_OFFSETS.items()} == KIMI_OFFSETS  # no token of ours Kimi lacks


def test_plain_text_gets_no_bos_and_round_trips(kimi_tok):
    text = "Grüße, 世界! tabs\tand  spaces"
    ids = kimi_tok(text)["input_ids"]
    assert ids and all(i < NUM_RANKS for i in ids)
    assert kimi_tok.decode(ids) == text
    mixed = kimi_tok.encode("a<|im_end|>b", add_special_tokens=False)
    assert NUM_RANKS + 2 in mixed and kimi_tok.decode(mixed) == "a<|im_end|>b"


def test_template_ids_equal_encoding_the_rendered_text(kimi_tok):
    text = kimi_tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>"
                    "<|im_user|>user<|im_middle|>Name a prime.<|im_end|>"
                    "<|im_assistant|>assistant<|im_middle|><think></think>Seven.<|im_end|>"
                    "<|im_user|>user<|im_middle|>Another one, with <think> in it?<|im_end|>"
                    "<|im_assistant|>assistant<|im_middle|><think>")
    ids = kimi_tok.apply_chat_template(CHAT, tokenize=True, add_generation_prompt=True, return_dict=True)["input_ids"]
    assert list(ids) == kimi_tok(text, add_special_tokens=False)["input_ids"]
    assert kimi_tok.decode(ids) == text


def test_rewrite_is_byte_identical(kimi_dir, tmp_path):
    write_kimi_tokenizer(tmp_path)
    for path in kimi_dir.iterdir():
        assert hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256((tmp_path / path.name).read_bytes()).digest()


def test_a_vocabulary_rewritten_in_place_is_read_again(kimi_dir, tmp_path):
    """tiktoken's own loader caches by path; the tokenizer must read the file as it is now."""
    model_dir = tmp_path / "tok"
    write_kimi_tokenizer(model_dir)
    before = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=True).encode("a", add_special_tokens=False)
    lines = (model_dir / "tiktoken.model").read_text().splitlines()
    a, b = ord("a"), ord("b")
    lines[a], lines[b] = f"{lines[b].split()[0]} {a}", f"{lines[a].split()[0]} {b}"  # swap the ranks of a and b
    (model_dir / "tiktoken.model").write_text("\n".join(lines) + "\n")
    after = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=True).encode("a", add_special_tokens=False)
    assert before == [a] and after == [b]
