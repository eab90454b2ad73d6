"""Tool calls in generated answers (pipeline/regen/tools.py): both wire formats read, and a call nesting thousands
deep is an unparsable call like any other malformed one, never a RecursionError that stops a regeneration for good
(every rerun would meet the same record)."""
from __future__ import annotations

import json

from pipeline.regen.tools import parse_tool_calls, same_calls

DEEP = "[" * 3000 + "]" * 3000


def test_both_wire_formats_are_read():
    text, calls = parse_tool_calls('Let me look.<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>')
    assert text == "Let me look." and calls == [{"type": "function", "function": {"name": "search",
                                                                                  "arguments": {"q": "x"}}}]
    kimi = ("ok<|tool_calls_section_begin|><|tool_call_begin|>functions.search:0<|tool_call_argument_begin|>"
            '{"q": "x"}<|tool_call_end|><|tool_calls_section_end|>')
    text, calls = parse_tool_calls(kimi)
    assert text == "ok" and calls[0]["function"] == {"name": "search", "arguments": '{"q": "x"}'}


def test_a_generated_call_nesting_thousands_deep_is_unparsable_not_a_crash():
    text, calls = parse_tool_calls(f"<tool_call>{DEEP}</tool_call>")
    assert calls == [{"type": "function", "function": {"name": "<unparsable>", "arguments": DEEP}}]


def test_recorded_arguments_nesting_thousands_deep_compare_as_text():
    recorded = [{"type": "function", "function": {"name": "f", "arguments": DEEP}}]
    generated = [{"type": "function", "function": {"name": "f", "arguments": json.dumps({"a": 1})}}]
    assert not same_calls(generated, recorded)
    assert same_calls(recorded, recorded)  # the same unparsable text on both sides is the same call
