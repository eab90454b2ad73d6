"""A tokenizer directory in Kimi-K2.5's own shape, for the tiny stand-in checkpoints.

Real Kimi-K2.5 ships a remote-code tokenizer: `tokenizer_config.json` whose `auto_map` points at
`tokenization_kimi.py`, a slow tokenizer over the tiktoken BPE file `tiktoken.model`, 256 special tokens right after
the BPE ranks, and a `chat_template.jinja` without generation markers. This writes the same files, of this project's
own writing, with a small vocabulary trained on the bundled conversations (deterministically), so that every path
that loads a Kimi tokenizer (trust_remote_code, tiktoken, the loss mask from special ids) is exercised for real.
"""
from __future__ import annotations

import base64
import json
import shutil
from importlib import resources
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from pipeline.factory.tokenizer import _training_texts, bundled_conversations_path

NUM_RANKS = 3840  # BPE ranks, ids 0..3839: 256 bytes + 3584 merges
NUM_SPECIAL = 256  # Kimi reserves 256 ids after the ranks
VOCAB_SIZE = NUM_RANKS + NUM_SPECIAL
# Offsets after the ranks (163584 in the real vocabulary): every named special token of Kimi-K2/K2.5's tokenizer, at
# its published id (../shared/KIMI_K25.md for bos/eos/im_*/media/unk/pad; public copies of the tokenizer's special-id
# table for the header, [EOT], tool-call and think tokens: 163590.., 163593, 163595..163599, 163606/163607).
SPECIAL_OFFSETS = {
    0: "[BOS]",
    1: "[EOS]",
    2: "<|im_end|>",
    3: "<|im_user|>",
    4: "<|im_assistant|>",
    6: "<|start_header_id|>",
    7: "<|end_header_id|>",
    9: "[EOT]",
    10: "<|im_system|>",
    11: "<|tool_calls_section_begin|>",
    12: "<|tool_calls_section_end|>",
    13: "<|tool_call_begin|>",
    14: "<|tool_call_argument_begin|>",
    15: "<|tool_call_end|>",
    17: "<|im_middle|>",
    18: "<|media_begin|>",
    19: "<|media_content|>",
    20: "<|media_end|>",
    21: "<|media_pad|>",
    22: "<think>",
    23: "</think>",
    254: "[UNK]",
    255: "[PAD]",
}
REMOTE_MODULE = "tokenization_kimi.py"
CHAT_TEMPLATE_FILE = "kimi_chat_template.jinja"
# The tiny merges need no frequency floor: with one, the bundled set yields too few merges to fill the ranks.
MIN_FREQUENCY = 1


def special_tokens() -> dict[int, str]:
    """Every special id (NUM_RANKS ..) and its token; unnamed offsets are reserved tokens, as in Kimi's file."""
    return {NUM_RANKS + offset: SPECIAL_OFFSETS.get(offset, f"<|reserved_token_{offset}|>")
            for offset in range(NUM_SPECIAL)}


def _package_file(name: str) -> Path:
    return Path(str(resources.files("pipeline.factory").joinpath(name)))


def train_ranks(corpus: Path) -> dict[bytes, int]:
    """Byte-level BPE (the tokenizers trainer breaks ties by pair id: deterministic) as tiktoken ranks: the 256 bytes
    in byte order, then each merge's bytes in merge order."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=NUM_RANKS, min_frequency=MIN_FREQUENCY, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(_training_texts(corpus), trainer=trainer)
    merges = json.loads(backend.to_str())["model"]["merges"]
    byte_of = {symbol: byte for byte, symbol in enumerate(_byte_level_symbols())}
    ranks = {bytes([byte]): byte for byte in range(256)}
    for left, right in merges:
        piece = bytes(byte_of[c] for c in left + right)
        ranks.setdefault(piece, len(ranks))
    if len(ranks) != NUM_RANKS:
        raise ValueError(f"BPE training on {corpus} gave {len(ranks)} ranks, expected {NUM_RANKS}")
    return ranks


def _byte_level_symbols() -> list[str]:
    # The tokenizers ByteLevel alphabet is GPT-2's byte table, the same one the remote module names its tokens with.
    from pipeline.factory.tokenization_kimi import _byte_symbols

    return _byte_symbols()


def write_tiktoken_model(path: Path, ranks: dict[bytes, int]) -> None:
    """`base64(bytes) rank` per line, the format tiktoken.load.load_tiktoken_bpe reads."""
    lines = [f"{base64.b64encode(piece).decode('ascii')} {rank}" for piece, rank in sorted(ranks.items(),
                                                                                          key=lambda kv: kv[1])]
    path.write_text("\n".join(lines) + "\n", encoding="ascii")


def tokenizer_config() -> dict:
    added = {str(i): {"content": token, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": True} for i, token in special_tokens().items()}
    return {
        "added_tokens_decoder": added,
        "auto_map": {"AutoTokenizer": [f"{REMOTE_MODULE.removesuffix('.py')}.TikTokenTokenizer", None]},
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "unk_token": "[UNK]",
        "pad_token": "[PAD]",
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1 << 20,
        "tokenizer_class": "TikTokenTokenizer",
    }


def write_kimi_tokenizer(out_dir: Path) -> None:
    """Write tokenizer_config.json, tokenization_kimi.py, tiktoken.model and chat_template.jinja into out_dir,
    byte-identically each time."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_tiktoken_model(out_dir / "tiktoken.model", train_ranks(bundled_conversations_path()))
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2) + "\n", encoding="utf-8")
    shutil.copyfile(_package_file(REMOTE_MODULE), out_dir / REMOTE_MODULE)
    shutil.copyfile(_package_file(CHAT_TEMPLATE_FILE), out_dir / "chat_template.jinja")
