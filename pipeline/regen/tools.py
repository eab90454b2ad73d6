"""Tool calls in a generated answer, as the record's messages spell them (`{"type": "function", "function": {"name",
"arguments"}}`), so that a regenerated call can be paired with the record's recorded result.

Two wire formats are read: Kimi's section tokens (`<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
<|tool_call_argument_begin|>{json}<|tool_call_end|>...<|tool_calls_section_end|>`) and the `<tool_call>{"name",
"arguments"}</tool_call>` blocks of Hermes-style templates. An answer in neither format has no calls.
"""
from __future__ import annotations

import json
import re
from typing import Any

from pipeline.core import jsonfile

_KIMI_SECTION = re.compile(r"<\|tool_calls_section_begin\|>(.*?)(?:<\|tool_calls_section_end\|>|$)", re.S)
_KIMI_CALL = re.compile(r"<\|tool_call_begin\|>\s*(?:functions\.)?([^\s:<]+)(?::\d+)?\s*"
                        r"<\|tool_call_argument_begin\|>(.*?)<\|tool_call_end\|>", re.S)
_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


class _Unparsable(ValueError):
    """Not a JSON value within the bounds every JSON the pipeline reads keeps (pipeline.core.jsonfile)."""


def _json(text: str, where: str) -> Any:
    """A generated or recorded JSON string, bounded in size and nesting: one that nests thousands deep is unparsable
    like any other malformed call, never a RecursionError that stops the whole regeneration."""
    return jsonfile.parse(text, _Unparsable, where=where)


def _call(name: str, arguments: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """(the answer's text outside its calls, the calls)."""
    section = _KIMI_SECTION.search(text)
    if section:
        calls = [_call(name, args.strip()) for name, args in _KIMI_CALL.findall(section.group(1))]
        return (text[:section.start()] + text[section.end():]).strip(), calls
    calls = []
    for block in _HERMES_CALL.findall(text):
        try:
            parsed = _json(block, "a generated tool call")
        except _Unparsable:
            calls.append(_call("<unparsable>", block))
            continue
        if isinstance(parsed, dict) and isinstance(parsed.get("name"), str):
            calls.append(_call(parsed["name"], parsed.get("arguments", {})))
        else:
            calls.append(_call("<unparsable>", block))
    return (_HERMES_CALL.sub("", text).strip() if calls else text), calls


def _arguments(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return _json(value, "a tool call's arguments")
        except _Unparsable:
            return value.strip()
    return value


def same_calls(calls: list[dict[str, Any]], recorded: list[dict[str, Any]]) -> bool:
    """The same functions with the same arguments (compared as JSON values), in the same order."""
    def key(call: dict[str, Any]) -> tuple[Any, str]:
        function = call.get("function") or {}
        return function.get("name"), json.dumps(_arguments(function.get("arguments")), sort_keys=True)
    return [key(c) for c in calls] == [key(c) for c in recorded]
