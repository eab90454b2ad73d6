"""A small byte-level BPE tokenizer with Kimi-K2 style special tokens and chat template.

The embedded default model needs a tokenizer that behaves like the real target's in the ways that matter to the
pipeline: the same special tokens (each a single id), the same chat layout, and a loss mask over assistant turns.
It is trained on the bundled conversations so that ordinary text costs a realistic number of tokens.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

MAX_VOCAB_SIZE = 4096
MIN_FREQUENCY = 2
BOS, EOS, PAD = "[BOS]", "[EOS]", "[PAD]"
IM_END, IM_USER, IM_ASSISTANT, IM_SYSTEM, IM_MIDDLE = (
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_system|>",
    "<|im_middle|>",
)
# Ids 0..7 in this order; fixed so that the tiny model's config can name them.
SPECIAL_TOKENS = [BOS, EOS, PAD, IM_END, IM_USER, IM_ASSISTANT, IM_SYSTEM, IM_MIDDLE]
CHAT_ROLE_TOKENS = [IM_SYSTEM, IM_USER, IM_ASSISTANT, IM_MIDDLE, IM_END]
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."

# Kimi-K2's layout: <|im_{role}|>{role}<|im_middle|>{content}<|im_end|>, with a default system turn when the
# conversation has none (Kimi does the same). The generation block covers exactly the assistant content plus its
# <|im_end|>, which is what the drafter learns to predict.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if loop.first and message['role'] != 'system' -%}"
    "<|im_system|>system<|im_middle|>" + DEFAULT_SYSTEM_PROMPT + "<|im_end|>"
    "{%- endif -%}"
    "{%- if message['role'] == 'system' -%}"
    "<|im_system|>system<|im_middle|>{{ message['content'] }}<|im_end|>"
    "{%- elif message['role'] == 'user' -%}"
    "<|im_user|>user<|im_middle|>{{ message['content'] }}<|im_end|>"
    "{%- elif message['role'] == 'assistant' -%}"
    "<|im_assistant|>assistant<|im_middle|>"
    "{%- generation -%}{{ message['content'] }}<|im_end|>{%- endgeneration -%}"
    "{%- else -%}"
    "{{ raise_exception('unsupported role: ' ~ message['role']) }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
)


def bundled_conversations_path() -> Path:
    return Path(str(resources.files("pipeline.data").joinpath("bundled", "conversations.jsonl")))


def _training_texts(path: Path) -> Iterator[str]:
    """Every message body of the bundled set, plus the fixed words the template adds around them."""
    yield DEFAULT_SYSTEM_PROMPT
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                for message in json.loads(line)["messages"]:
                    yield message["role"]  # once per turn, as the template writes it, so role names merge
                    yield message["content"]


def train_backend(corpus: Path, vocab_size: int = MAX_VOCAB_SIZE) -> Tokenizer:
    """Byte-level BPE; the tokenizers trainer breaks count ties by pair id, so training is deterministic."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=MIN_FREQUENCY,
        special_tokens=SPECIAL_TOKENS,
        # All 256 bytes, so any text (including scripts absent from the corpus) still encodes.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_training_texts(corpus), trainer=trainer)
    return tokenizer


def wrap(backend: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        extra_special_tokens=CHAT_ROLE_TOKENS,
        chat_template=CHAT_TEMPLATE,
        model_max_length=1 << 20,
        clean_up_tokenization_spaces=False,
    )


def build_tokenizer(out_dir: Path) -> None:
    """Train on the bundled conversations and save a transformers tokenizer to out_dir, byte-identically each time."""
    out_dir = Path(out_dir)
    backend = train_backend(bundled_conversations_path())
    if backend.get_vocab_size() > MAX_VOCAB_SIZE:
        raise ValueError(f"vocabulary has {backend.get_vocab_size()} tokens, more than {MAX_VOCAB_SIZE}")
    out_dir.mkdir(parents=True, exist_ok=True)
    wrap(backend).save_pretrained(out_dir)
    _make_config_portable(out_dir / "tokenizer_config.json")


def _make_config_portable(config_path: Path) -> None:
    """Rewrite the config in the form transformers 4.x also loads (the vLLM/SGLang environments may pin 4.x).

    transformers 5 saves its own class name (TokenizersBackend) and a list-valued extra_special_tokens, which 4.x
    cannot read; both versions read PreTrainedTokenizerFast and additional_special_tokens.
    """
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["additional_special_tokens"] = config.pop("extra_special_tokens")
    config.pop("backend", None)
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
