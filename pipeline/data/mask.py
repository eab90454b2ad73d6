"""Token ids and loss mask of a record, rendered through the target's own chat template.

Three ways to find the assistant tokens, chosen once per tokenizer (`ChatTokenizer.method`):
- `special_ids`, for every tokenizer with Kimi's turn tokens (real Kimi-K2.5 and all the tiny models): the turns are
  `<|im_{kind}|>role<|im_middle|>...<|im_end|>`, found by their ids in the rendered conversation;
- `generation_markers`: the template's {% generation %} spans, mapped to tokens by transformers;
- `incremental`: the tokens each assistant message adds to the rendered prefix (any other template).

Kimi's templates (the real one and the tiny stand-ins) open every turn with a role token, close its header with
`<|im_middle|>` and end it with `<|im_end|>`, each a single control id. The assistant spans are found by those ids in
the rendered conversation, never by counting tokens, so whatever the template writes around the content (a default
system turn, a tool declaration, `<think></think>`) cannot shift the mask.

What counts as trained, for an EAGLE-3 drafter (which learns to predict what the target generates when serving):
- an assistant turn's body through its `<|im_end|>`: content, reasoning, `</think>` after reasoning, tool calls;
- not the `<think>` that opens the body (serving puts it in the prompt: Kimi's generation prompt ends with it), nor
  the `</think>` of an empty pair (past turns are rendered `<think></think>`; no serving step generates it):
  `train_think_tags` trains them too;
- not the default system turn the template injects (not generated; the same in every sample): `train_default_system`
  trains its body too.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

import jinja2
from transformers.utils.chat_template_utils import render_jinja_template

from pipeline.data.sources import Parsed, RecordError, check_unicode

_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
OPENERS = {"<|im_user|>": "user", "<|im_assistant|>": "assistant", "<|im_system|>": "system"}
MIDDLE, END, THINK, THINK_END = "<|im_middle|>", "<|im_end|>", "<think>", "</think>"


@dataclass(frozen=True, kw_only=True)
class MaskOptions:
    train_default_system: bool = False
    train_think_tags: bool = False

    @classmethod
    def of(cls, data: Any) -> "MaskOptions":
        """From the data config (`data.train_default_system`, `data.train_think_tags`)."""
        return cls(train_default_system=data.train_default_system, train_think_tags=data.train_think_tags)


@dataclass(frozen=True, kw_only=True)
class TurnIds:
    openers: dict[int, str]  # id -> the kind of turn it opens (user, assistant, system)
    middle: int
    end: int
    think: int | None
    think_end: int | None


@dataclass(frozen=True, kw_only=True)
class Turn:
    kind: str  # from the opening token: user | assistant | system (Kimi opens tool results as system turns)
    role: str  # the role name written between the opener and <|im_middle|>
    body: int  # index of the first token after <|im_middle|>
    end: int  # index of the closing <|im_end|>


def _single_id(tokenizer: Any, vocab: dict[str, int], token: str) -> int | None:
    if token not in vocab:
        return None
    ids = tokenizer.encode(token, add_special_tokens=False)
    return ids[0] if len(ids) == 1 else None


def turn_ids(tokenizer: Any) -> TurnIds | None:
    """The turn tokens' ids when the tokenizer has all of them as single ids (Kimi's layout), else None."""
    vocab = tokenizer.get_vocab()
    ids = {token: _single_id(tokenizer, vocab, token) for token in (*OPENERS, MIDDLE, END, THINK, THINK_END)}
    if any(ids[token] is None for token in (*OPENERS, MIDDLE, END)):
        return None
    return TurnIds(openers={ids[token]: kind for token, kind in OPENERS.items()}, middle=ids[MIDDLE], end=ids[END],
                   think=ids[THINK], think_end=ids[THINK_END])


def split_turns(input_ids: list[int], t: TurnIds, tokenizer: Any, cut: bool = False) -> list[Turn]:
    """Every turn in the rendered ids, in order; a control token out of place is a RecordError (a message whose text
    holds the template's own special tokens, which encode as control ids). With `cut` (the text was cut short before
    tokenising) the last turn may be open: its body runs to the end, and a header without its <|im_middle|> is no
    turn."""
    turns: list[Turn] = []
    i, n = 0, len(input_ids)
    while i < n:
        kind = t.openers.get(input_ids[i])
        if kind is None:
            i += 1
            continue
        if cut and t.middle not in input_ids[i + 1:]:
            break
        middle = _next(input_ids, i + 1, t.middle, t, f"the {kind} turn at token {i} has no {MIDDLE}")
        if cut and t.end not in input_ids[middle + 1:]:
            turns.append(Turn(kind=kind, role=tokenizer.decode(input_ids[i + 1:middle]), body=middle + 1, end=n - 1))
            break
        end = _next(input_ids, middle + 1, t.end, t, f"the {kind} turn at token {i} has no {END}")
        role = tokenizer.decode(input_ids[i + 1:middle])
        turns.append(Turn(kind=kind, role=role, body=middle + 1, end=end))
        i = end + 1
    return turns


def _next(input_ids: list[int], start: int, wanted: int, t: TurnIds, missing: str) -> int:
    for j in range(start, len(input_ids)):
        if input_ids[j] == wanted:
            return j
        if input_ids[j] in t.openers or input_ids[j] in (t.middle, t.end):
            break
    raise RecordError("template_structure", f"{missing} before the next turn token (does a message's text contain "
                                            f"the template's special tokens?)")


def _check_counts(turns: list[Turn], messages: list[dict[str, Any]], cut: bool = False) -> None:
    for kind in ("user", "assistant"):
        found = sum(turn.kind == kind for turn in turns)
        expected = sum(message["role"] == kind for message in messages)
        if found != expected and not (cut and found < expected):
            raise RecordError("template_structure", f"the rendered conversation has {found} {kind} turns for "
                                                    f"{expected} {kind} messages")


def loss_mask(input_ids: list[int], messages: list[dict[str, Any]], t: TurnIds, tokenizer: Any,
              options: MaskOptions, cut: bool = False) -> list[int]:
    """1 on the trained tokens; `cut`: the ids are those of the rendered text's first characters only."""
    turns = split_turns(input_ids, t, tokenizer, cut)
    _check_counts(turns, messages, cut)
    mask = [0] * len(input_ids)
    if options.train_default_system and messages[0]["role"] != "system":
        injected = next((turn for turn in turns if turn.kind == "system" and turn.role == "system"), None)
        if injected is not None:
            mask[injected.body:injected.end + 1] = [1] * (injected.end + 1 - injected.body)
    for turn in turns:
        if turn.kind != "assistant":
            continue
        start = turn.body
        if not options.train_think_tags and t.think is not None and start < turn.end and input_ids[start] == t.think:
            start += 1  # the opening <think>: part of the prompt when serving
            if start < turn.end and input_ids[start] == t.think_end:
                start += 1  # an empty pair: written by the template, never generated
        mask[start:turn.end + 1] = [1] * (turn.end + 1 - start)
    return mask


class ChatTokenizer:
    """A tokenizer, the way its template's assistant tokens are found, and the mask options: one per data file.

    A record is rendered (`text_of`) before it is tokenised (`encode`), so that its length is known before the
    tokenizer sees it. Whatever the template or the tokenizer raise on one record (both are the checkpoint's, the
    tokenizer possibly remote code) is that record's reject (`template_error`, `tokenizer_error`, `too_deep`), never
    the data set's end."""

    def __init__(self, tokenizer: Any, options: MaskOptions | None = None) -> None:
        self.tokenizer = tokenizer
        self.options = options or MaskOptions()
        self.turn_ids = turn_ids(tokenizer)
        self._has_markers = bool(tokenizer.chat_template) and has_generation_markers(tokenizer.chat_template)
        self.method = "special_ids" if self.turn_ids else "generation_markers" if self._has_markers else "incremental"

    def record(self) -> dict[str, Any]:
        """What provenance says about the loss mask."""
        return {"method": self.method, **asdict(self.options)}

    def tokenize(self, parsed: Parsed) -> tuple[list[int], list[int]]:
        """Token ids and loss mask (1 = train on this token) for a parsed record."""
        return self.encode(parsed, self.text_of(parsed))

    def can_cut(self, parsed: Parsed) -> bool:
        """Whether `encode` can take the rendered text cut short: raw text, and Kimi's turn tokens (whose mask is
        found in the ids); the other methods render the conversation themselves."""
        return parsed.text is not None or self.turn_ids is not None

    def text_of(self, parsed: Parsed) -> str:
        """The text the tokenizer will see: a `text` record's text, or the conversation rendered by the template."""
        if parsed.text is not None:
            text = parsed.text
        else:
            if not self.tokenizer.chat_template:
                raise ValueError("the tokenizer has no chat template; chat records need one")
            text = _guarded("template_error", "the chat template", lambda: render_chat(
                self.tokenizer, parsed.messages, False, parsed.tools))
        check_unicode(text, "the rendered text")
        return text

    def encode(self, parsed: Parsed, text: str, cut: bool = False) -> tuple[list[int], list[int]]:
        """Ids and mask of `text` (from `text_of`; with `cut`, its first characters only, see `can_cut`)."""
        if parsed.text is not None:
            # Raw text trains on everything; special tokens are whatever the tokenizer adds to plain text by default.
            input_ids = _guarded("tokenizer_error", "the tokenizer", lambda: list(self.tokenizer(text)["input_ids"]))
            return input_ids, [1] * len(input_ids)
        if self.turn_ids is not None:
            input_ids = _guarded("tokenizer_error", "the tokenizer", lambda: encode_text(self.tokenizer, text))
            return input_ids, loss_mask(input_ids, parsed.messages, self.turn_ids, self.tokenizer, self.options, cut)
        if cut:
            raise ValueError(f"the {self.method} mask renders the conversation itself: it cannot take a cut text")
        method = mask_from_markers if self._has_markers else mask_incremental
        return _guarded("tokenizer_error", f"the {self.method} mask",
                        lambda: method(self.tokenizer, parsed.messages, parsed.tools))


def _guarded(reason: str, what: str, call: Any) -> Any:
    """`call()`, whose errors are the record's: a RecordError as it is, a template's error as `template_error`, a
    RecursionError as `too_deep`, anything else as `reason`, with the exception's type and message."""
    try:
        return call()
    except RecordError:
        raise
    except jinja2.TemplateError as e:
        raise RecordError("template_error", f"the chat template refused the conversation: {e}") from e
    except RecursionError as e:
        raise RecordError("too_deep", f"{what} recursed too deep on this record") from e
    except Exception as e:  # noqa: BLE001 - the checkpoint's own code, on one record: that record's reject
        raise RecordError(reason, f"{what} failed on this record: {type(e).__name__}: {e}") from e


def tokenize(parsed: Parsed, tokenizer: Any, options: MaskOptions | None = None) -> tuple[list[int], list[int]]:
    return ChatTokenizer(tokenizer, options).tokenize(parsed)


def has_generation_markers(chat_template: str | None) -> bool:
    if not chat_template:
        raise ValueError("the tokenizer has no chat template; chat records need one")
    return bool(_GENERATION_TAG.search(chat_template))


def mask_from_markers(tokenizer: Any, messages: list[dict[str, Any]],
                      tools: list[Any] | None = None) -> tuple[list[int], list[int]]:
    """The template's {% generation %} spans, mapped to tokens by transformers."""
    out = tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    return list(out["input_ids"]), list(out["assistant_masks"])


def mask_incremental(tokenizer: Any, messages: list[dict[str, Any]],
                     tools: list[Any] | None = None) -> tuple[list[int], list[int]]:
    """For templates with neither Kimi's turn tokens nor generation markers: the tokens each assistant message adds.

    The prefix before message i, rendered with the generation prompt, ends where the assistant's content starts;
    the prefix through message i ends after its end-of-turn token. Both must be token prefixes of the whole
    conversation, else the template rewrites history (e.g. drops earlier reasoning) and this method cannot apply.
    """
    input_ids = encode_chat(tokenizer, messages, False, tools)
    mask = [0] * len(input_ids)
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = _prefix_length(tokenizer, messages[:index], True, input_ids, index, tools)
        end = _prefix_length(tokenizer, messages[: index + 1], False, input_ids, index, tools)
        mask[start:end] = [1] * (end - start)
    return input_ids, mask


def _prefix_length(tokenizer: Any, messages: list[dict[str, Any]], add_generation_prompt: bool, full_ids: list[int],
                   index: int, tools: list[Any] | None) -> int:
    prefix_ids = encode_chat(tokenizer, messages, add_generation_prompt, tools)
    if prefix_ids != full_ids[: len(prefix_ids)]:
        raise RecordError(
            "template_not_incremental",
            f"rendering up to message {index} ({len(prefix_ids)} tokens) is not a prefix of the whole conversation "
            f"({len(full_ids)} tokens), so the assistant tokens cannot be located without generation markers",
        )
    return len(prefix_ids)


def encode_chat(tokenizer: Any, messages: list[dict[str, Any]], add_generation_prompt: bool,
                tools: list[Any] | None = None) -> list[int]:
    return encode_text(tokenizer, render_chat(tokenizer, messages, add_generation_prompt, tools))


def render_chat(tokenizer: Any, messages: list[dict[str, Any]], add_generation_prompt: bool,
                tools: list[Any] | None = None) -> str:
    # render_jinja_template, unlike apply_chat_template, accepts the empty prefix before a leading assistant turn.
    rendered, _ = render_jinja_template(
        conversations=[messages],
        tools=tools,
        chat_template=tokenizer.get_chat_template(),
        add_generation_prompt=add_generation_prompt,
        **tokenizer.special_tokens_map,
    )
    return rendered[0]


def encode_text(tokenizer: Any, rendered: str) -> list[int]:
    # The same call apply_chat_template makes: the template already wrote every special token.
    return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])
