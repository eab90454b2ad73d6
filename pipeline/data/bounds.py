"""How much of a record the data stage reads and tokenises, derived from `data.max_length` and the tokenizer.

Tokenising costs about 100 bytes of memory per character (a 200 MB record took 20 GB), so a record's size is checked
before it is tokenised, at two places:
- reading: a record (a JSONL line, a Parquet row, an element of a JSON array) larger than `max_record_bytes` is
  rejected as `too_long` with its size, under either length policy. A JSONL line is measured as it is read, in 1 MiB
  steps, so reading it never holds more than the bound;
- before tokenising: the rendered text (chat template applied, or a `text` record) longer than `max_chars` holds more
  than `max_length` tokens whatever it says, since no token covers more characters than the vocabulary's longest
  entry. Under `length_policy=reject` it is rejected as `too_long`; under `truncate` it is cut to `max_chars`
  characters, tokenised, and then cut to `max_length` tokens as every truncated record is. The cut keeps
  `MARGIN_TOKENS` tokens beyond `max_length`, so the first `max_length` tokens are those of the whole text.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Tokens kept beyond max_length when a long text is cut by characters: a tokenizer's choice for a token depends on
# the text around it (a BPE word, a regex pre-token), so the cut stays this many tokens away from what is kept.
MARGIN_TOKENS = 64
# Bytes of a record per character of text it may hold: one character written as a JSON escape takes at most 12 bytes
# (a surrogate pair, "\ud83d\ude00"); the rest leaves room for field names and the JSON around the text.
BYTES_PER_CHAR = 16
# Nesting of a record's JSON (objects and arrays): a conversation with tool calls and tool schemas needs about 10.
MAX_JSON_DEPTH = 64


def longest_token_chars(tokenizer: Any) -> int:
    """Characters of the vocabulary's longest entry, special tokens included: the most text one token can stand for
    (a byte-level entry has one character per byte, and a byte decodes to at most one character)."""
    entries = list(tokenizer.get_vocab())
    entries += [str(token) for token in getattr(tokenizer, "added_tokens_decoder", {}).values()]
    return max(1, *map(len, entries))


@dataclass(frozen=True, kw_only=True, slots=True)
class RecordBounds:
    max_length: int  # data.max_length, tokens
    token_chars: int  # the longest token, in characters

    @classmethod
    def of(cls, tokenizer: Any, max_length: int) -> "RecordBounds":
        return cls(max_length=max_length, token_chars=longest_token_chars(tokenizer))

    @property
    def max_chars(self) -> int:
        """Rendered characters beyond which a text certainly holds more than max_length + MARGIN_TOKENS tokens."""
        return (self.max_length + MARGIN_TOKENS) * self.token_chars

    @property
    def max_record_bytes(self) -> int:
        return self.max_chars * BYTES_PER_CHAR

    def why(self) -> str:
        """Where the bounds come from, for a reject's detail."""
        return (f"data.max_length={self.max_length}: {self.max_length} + {MARGIN_TOKENS} tokens of at most "
                f"{self.token_chars} characters are at most {self.max_chars:,} characters, "
                f"{self.max_record_bytes:,} bytes as JSON")
