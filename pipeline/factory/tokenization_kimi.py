"""A slow transformers tokenizer over a tiktoken BPE file, in the shape of Kimi's remote-code tokenizer.

Written by this project (not Moonshot's file): `pipeline.factory.kimi_tokenizer` copies it into a model directory as
`tokenization_kimi.py`, where `tokenizer_config.json`'s `auto_map` points to it, so that loading the tiny Kimi
checkpoints needs `trust_remote_code` exactly as the real one does (the pipeline imports it only for its byte table).

The mergeable ranks come from `tiktoken.model`; the special tokens are transformers added tokens (ids after the
ranks), so a special-token string inside text encodes as its control token and nothing is added around the text
(no BOS).
"""
from __future__ import annotations

import base64
import os
import shutil
from typing import Any

import tiktoken
from transformers import PreTrainedTokenizer

VOCAB_FILES_NAMES = {"vocab_file": "tiktoken.model"}
# GPT-2's pre-tokenization split: the ranks were trained over exactly these pieces.
PAT_STR = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def read_ranks(path: str) -> dict[bytes, int]:
    """The `base64(bytes) rank` lines of a tiktoken BPE file, read from the file itself each time.

    Not tiktoken.load.load_tiktoken_bpe: it caches every file it reads under the temp directory keyed by the path
    alone, so a checkpoint rewritten in place would load its old vocabulary.
    """
    with open(path, "rb") as f:
        lines = f.read().splitlines()
    return {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in lines if line)}


def _byte_symbols() -> list[str]:
    """One printable character per byte value (GPT-2's table), so that every rank has a string token name."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            symbols[byte] = chr(byte)
        else:
            symbols[byte] = chr(256 + extra)
            extra += 1
    return [symbols[byte] for byte in range(256)]


class TikTokenTokenizer(PreTrainedTokenizer):
    vocab_files_names = VOCAB_FILES_NAMES
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file: str, bos_token: str = "[BOS]", eos_token: str = "[EOS]",
                 unk_token: str = "[UNK]", pad_token: str = "[PAD]", **kwargs: Any) -> None:
        # Set before the base class runs: its __init__ already asks for the vocabulary.
        self.vocab_file = vocab_file
        ranks = read_ranks(vocab_file)
        self._encoding = tiktoken.Encoding(name=os.path.basename(os.path.dirname(os.path.abspath(vocab_file))),
                                           pat_str=PAT_STR, mergeable_ranks=ranks, special_tokens={})
        table = _byte_symbols()
        self._byte_of = {symbol: byte for byte, symbol in enumerate(table)}
        self._token_of = {rank: "".join(table[b] for b in piece) for piece, rank in ranks.items()}
        self._rank_of = {token: rank for rank, token in self._token_of.items()}
        kwargs.setdefault("clean_up_tokenization_spaces", False)
        super().__init__(bos_token=bos_token, eos_token=eos_token, unk_token=unk_token, pad_token=pad_token,
                         **kwargs)

    @property
    def vocab_size(self) -> int:
        return len(self._token_of)

    def get_vocab(self) -> dict[str, int]:
        return {**self._rank_of, **self.added_tokens_encoder}

    def _tokenize(self, text: str, **kwargs: Any) -> list[str]:
        # The base class has already cut the special tokens out, so this is ordinary text only.
        return [self._token_of[rank] for rank in self._encoding.encode_ordinary(text)]

    def _convert_token_to_id(self, token: str) -> int:
        rank = self._rank_of.get(token)
        return rank if rank is not None else self.added_tokens_encoder.get(token, self.unk_token_id)

    def _convert_id_to_token(self, index: int) -> str:
        token = self._token_of.get(index)
        if token is None:
            added = self.added_tokens_decoder.get(index)
            token = added.content if added is not None else self.unk_token
        return token

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        data = bytearray()
        for token in tokens:
            if token in self._rank_of:
                data += bytes(self._byte_of[symbol] for symbol in token)
            else:  # an added (special) token: its text as written
                data += token.encode("utf-8")
        return data.decode("utf-8", errors="replace")

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str]:
        name = (filename_prefix + "-" if filename_prefix else "") + VOCAB_FILES_NAMES["vocab_file"]
        target = os.path.join(save_directory, name)
        if os.path.abspath(target) != os.path.abspath(self.vocab_file):
            shutil.copyfile(self.vocab_file, target)
        return (target,)
