"""Prompt files (JSONL, JSON, Parquet; gzip, zstd or bz2 compressed or not): checked before any model loads, digested,
and each record (read by `pipeline/data/records.py`) turned into a conversation or a plain text.

Nothing here tokenizes: a record either parses into a `Parsed` value or raises `RecordError` with a machine-readable
reason, so that one bad record never stops the ones around it.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from pipeline.data.bounds import MAX_JSON_DEPTH
from pipeline.data.compression import COMPRESSION_SUFFIXES, format_suffix, open_data
from pipeline.data.records import measure, parquet_file

SUPPORTED_SUFFIXES = (".jsonl", ".json", ".parquet")
OPENAI_ROLES = {"system": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
SHAREGPT_ROLES = {**OPENAI_ROLES, "human": "user", "gpt": "assistant"}
# Content parts and record fields that carry media (OpenAI, Anthropic-style and LLaVA/ShareGPT exports). The capture is
# text-only: such a record is rejected, never captured with its media left out or replaced by placeholders.
MEDIA_PART_TYPES = {"image", "image_url", "input_image", "audio", "audio_url", "input_audio", "video", "video_url",
                    "input_video", "file", "input_file"}
MEDIA_FIELDS = ("image", "images", "audio", "audios", "video", "videos")
# Message fields passed on to the chat template besides role and content (tool use and reasoning, as Kimi's has them).
TOOL_CALL_FIELDS = ("tool_calls", "reasoning_content", "tool_call_id", "name")


class RecordError(Exception):
    """A record that cannot become a sample; `reason` is the Reject code."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Parsed:
    """Either a chat (`messages`: role, content and tool fields; `tools`: the declared tools) rendered through the chat
    template, or raw `text`."""

    messages: list[dict[str, Any]] | None = None
    text: str | None = None
    tools: list[Any] | None = None


def check_readable(path: str | Path) -> None:
    """Fail early, before any model loads, on a data file that cannot be read (a compressed one: on its first MiB)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"data file not found: {path}")
    if not path.is_file():
        raise ValueError(f"data path is not a regular file: {path}")
    if format_suffix(path) not in SUPPORTED_SUFFIXES:
        raise ValueError(f"unsupported data file type {path.name!r}; expected one of {', '.join(SUPPORTED_SUFFIXES)}, "
                         f"optionally compressed ({', '.join(COMPRESSION_SUFFIXES)}: recognised by content)")
    try:
        with open_data(path) as f:
            f.read(1 << 20)
    except OSError as e:
        raise ValueError(f"data file is not readable: {path}: {e}") from e
    if format_suffix(path) == ".parquet":
        _check_parquet_footer(path)


def _check_parquet_footer(path: Path) -> None:
    try:
        parquet_file(path)  # reads only the footer of a plain file
    except (OSError, ValueError, pa.ArrowException) as e:
        raise ValueError(f"data file is not valid parquet: {path}: {e}") from e


def file_digest(path: Path) -> str:
    """sha256 of the file's content, decompressed: the source identity that sample ids derive from (a file and its
    gzip or zstd copy are one source, with the same ids)."""
    digest = hashlib.sha256()
    with open_data(path) as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def parse_record(value: Any, *, require_answer: bool = True) -> Parsed:
    """The conversation or text a record holds; raises RecordError naming what is wrong with it. With
    `require_answer` (extract: it trains on the record's answers) a conversation needs an assistant turn; regeneration
    writes the answers, so a prompt alone is a record there."""
    if not isinstance(value, dict):
        raise RecordError("not_an_object", f"record is a JSON {_kind(value)}, expected an object")
    if (depth := measure(value)[1]) > MAX_JSON_DEPTH:
        raise RecordError("too_deep", f"the record nests {depth}+ levels, more than {MAX_JSON_DEPTH}")
    # Parquet fills absent columns with nulls, so a null field counts as absent.
    present = {key: val for key, val in value.items() if val is not None}
    if not present:
        raise RecordError("empty", "record has no fields" if not value else "every field is null")
    _reject_media_fields(present)
    tools = _tools(present.get("tools"))
    if "messages" in present:
        messages = _parse_turns(present["messages"], "messages", ("role", "content"), OPENAI_ROLES, require_answer)
        return Parsed(messages=messages, tools=tools)
    if "conversations" in present:
        turns = present["conversations"]
        return Parsed(messages=_parse_turns(turns, "conversations", ("from", "value"), SHAREGPT_ROLES, require_answer),
                      tools=tools)
    if "prompt" in present:
        return Parsed(messages=_parse_prompt(present, require_answer), tools=tools)
    if "text" in present:
        return Parsed(text=_text_content(present["text"], "text"))
    raise RecordError(
        "unknown_format", f"no messages, conversations, prompt or text field; fields: {sorted(value)[:10]}"
    )


def _reject_media_fields(record: dict[str, Any]) -> None:
    for name in MEDIA_FIELDS:
        if record.get(name) not in (None, [], "", {}):
            raise RecordError("media_content", f"the record has {name!r}: the capture is text-only (image, audio and "
                                               f"video inputs are not supported)")


def _tools(tools: Any) -> list[Any] | None:
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise RecordError("unknown_format", f"tools is a {_kind(tools)}, expected a list of tool objects")
    return tools


def _parse_turns(turns: Any, field: str, keys: tuple[str, str], roles: dict[str, str],
                 require_answer: bool = True) -> list[dict[str, Any]]:
    messages = _turns(turns, field, keys, roles)
    if require_answer:
        _require_assistant(messages)
    return messages


def _turns(turns: Any, field: str, keys: tuple[str, str], roles: dict[str, str]) -> list[dict[str, str]]:
    if not isinstance(turns, list):
        raise RecordError("unknown_format", f"{field} is a {_kind(turns)}, expected a list of turns")
    if not turns:
        raise RecordError("empty", f"{field} is an empty list")
    role_key, content_key = keys
    messages = []
    for index, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise RecordError("unknown_format", f"{field}[{index}] is a {_kind(turn)}, expected an object")
        raw_role = turn.get(role_key, turn.get("role"))  # some ShareGPT exports mix in role/content
        role = roles.get(raw_role) if isinstance(raw_role, str) else None
        if role is None:
            raise RecordError("unknown_role", f"{field}[{index}] has role {raw_role!r}; known: {sorted(roles)}")
        where = f"{field}[{index}]"
        extra = _tool_fields(turn, role, where)
        content = turn.get(content_key, turn.get("content"))
        if extra.get("tool_calls") and (content is None or content == ""):
            content = ""  # an assistant turn that only calls tools
        else:
            content = _text_content(content, where)
        messages.append({"role": role, "content": content, **extra})
    return messages


def _tool_fields(turn: dict[str, Any], role: str, where: str) -> dict[str, Any]:
    extra = {key: turn[key] for key in TOOL_CALL_FIELDS if turn.get(key) not in (None, [], "")}
    calls = extra.get("tool_calls")
    if calls is not None:
        if role != "assistant":
            raise RecordError("unknown_format", f"{where} has tool_calls but role {role!r}; only assistants call tools")
        if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("function"), dict)
                                                  and "name" in c["function"] for c in calls):
            raise RecordError("unknown_format", f"{where}.tool_calls must be a list of {{function: {{name, ...}}}}")
    for key in ("reasoning_content", "tool_call_id", "name"):
        if key in extra and not isinstance(extra[key], str):
            raise RecordError("unknown_format", f"{where}.{key} is a {_kind(extra[key])}, expected a string")
    return extra


def _parse_prompt(record: dict[str, Any], require_answer: bool = True) -> list[dict[str, str]]:
    messages = []
    if "system" in record:
        messages.append({"role": "system", "content": _text_content(record["system"], "system")})
    messages += _prompt_part(record["prompt"], "prompt", "user")
    answer_field = "response" if "response" in record else "completion"
    if answer_field in record:
        messages += _prompt_part(record[answer_field], answer_field, "assistant")
    if require_answer:
        _require_assistant(messages)
    return messages


def _prompt_part(value: Any, field: str, role: str) -> list[dict[str, str]]:
    """A string is one turn of `role`; a list of role/content objects is already turns (TRL's conversational form)."""
    if isinstance(value, list) and value and all(isinstance(turn, dict) and "role" in turn for turn in value):
        return _turns(value, field, ("role", "content"), OPENAI_ROLES)
    return [{"role": role, "content": _text_content(value, field)}]


def _require_assistant(messages: list[dict[str, Any]]) -> None:
    # Generating missing answers is the regeneration stage's job (pipeline.regenerate), not data preparation's.
    if not any(message["role"] == "assistant" for message in messages):
        roles = [message["role"] for message in messages]
        raise RecordError("no_assistant_turn", f"no assistant turn to train on; roles: {roles}")


def _text_content(content: Any, where: str) -> str:
    """The text of a content field; OpenAI-style lists of text parts are joined as Kimi's template joins them."""
    if isinstance(content, list):
        content = _join_text_parts(content, where)
    if content is None or (isinstance(content, str) and not content.strip()):
        raise RecordError("empty", f"{where} has empty content")
    if not isinstance(content, str):
        raise RecordError("non_text_content", f"{where} content is a {_kind(content)}, expected text")
    check_unicode(content, where)
    return content


def check_unicode(text: str, where: str) -> None:
    """A lone surrogate (valid JSON: "\\ud800", common in scraped data) is not a character: no tokenizer can encode
    it (some raise, some silently write U+FFFD), so the record is rejected rather than captured as other text."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RecordError("invalid_text", f"{where} holds a lone surrogate U+{ord(text[e.start]):04X} at character "
                                          f"{e.start}: not a Unicode character, no tokenizer can encode it") from None


def _join_text_parts(parts: list[Any], where: str) -> str:
    texts = []
    for index, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else _kind(part)
        if kind in MEDIA_PART_TYPES or (isinstance(part, dict) and MEDIA_PART_TYPES & part.keys()):
            raise RecordError("media_content", f"{where} content part {index} is {kind!r}: the capture is text-only "
                                               f"(image, audio and video inputs are not supported)")
        if kind != "text" or not isinstance(part.get("text"), str):
            raise RecordError("non_text_content", f"{where} content part {index} is {kind!r}, only text is supported")
        texts.append(part["text"])
    return "".join(texts)


def _kind(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)
