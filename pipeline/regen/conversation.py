"""One conversation regenerated turn by turn: which prompt each assistant turn gets, and what the target's answer
becomes in the history of the next.

Every assistant turn of the record is regenerated in order against the target's own earlier answers (and a record
ending with a user or tool turn gets one more turn). The prompt is the history rendered by the model's chat template
with its generation prompt, as serving renders it: for Kimi that strips earlier turns' reasoning, while the current
turn's generated `<think>...</think>` stays in its ids. The answer enters the history as the template expects it:
reasoning (before `</think>`) as `reasoning_content`, the rest as `content`, the end-of-turn id left out.

Tool calls are never executed: a regenerated call is paired with the record's recorded result when names and
arguments match the record's calls; otherwise the conversation ends after that turn, with the reason.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pipeline.core.contracts import Generation
from pipeline.data.mask import TurnIds
from pipeline.regen.tools import parse_tool_calls, same_calls

COMPLETE, TRUNCATED, TOO_LONG = "complete", "truncated", "too_long"
TOOL_MISMATCH, UNEXPECTED_TOOL = "tool_call_mismatch", "unexpected_tool_call"


@dataclass(frozen=True, kw_only=True)
class Conversation:
    """One (record, sample) to regenerate, as the driver prepared it (picklable: it travels to Ray actors)."""

    conversation_id: str
    record_id: str
    source: str
    row: int
    sample: int
    messages: tuple[dict[str, Any], ...]  # the record's parsed messages
    tools: list[Any] | None
    seed: int


@dataclass(kw_only=True)
class Turn:
    turn: int
    messages: list[dict[str, Any]]
    prompt_ids: list[int]
    output_ids: list[int]
    finish_reason: str
    seed: int
    applied: dict[str, Any]
    text: str

    def row(self) -> dict[str, Any]:
        return {"turn": self.turn, "messages": json.dumps(self.messages, ensure_ascii=False, sort_keys=True),
                "prompt_ids": self.prompt_ids, "output_ids": self.output_ids, "finish_reason": self.finish_reason,
                "seed": self.seed, "applied": json.dumps(self.applied, sort_keys=True, default=str),
                "text": self.text}


@dataclass(kw_only=True)
class State:
    """A conversation in progress: the history so far (the target's answers in place of the record's), where the
    record's messages continue, and the turns regenerated."""

    conversation: Conversation
    history: list[dict[str, Any]] = field(default_factory=list)
    next_message: int = 0
    turns: list[Turn] = field(default_factory=list)
    end_reason: str | None = None
    end_detail: str | None = None

    @property
    def done(self) -> bool:
        return self.end_reason is not None

    def pending(self) -> list[dict[str, Any]] | None:
        """The history the next turn's prompt renders, having moved past the record's non-assistant messages; None
        (and the conversation complete) when no assistant turn is left."""
        messages = self.conversation.messages
        while self.next_message < len(messages) and messages[self.next_message]["role"] != "assistant":
            self.history.append(dict(messages[self.next_message]))
            self.next_message += 1
        if self.next_message < len(messages) and not self.history:
            self.end("no_prompt", "the record opens with an assistant turn: there is no prompt to answer")
            return None
        if self.next_message < len(messages) or (self.history and self.history[-1]["role"] != "assistant"):
            return list(self.history)
        self.end("complete")
        return None

    def end(self, reason: str, detail: str | None = None) -> None:
        self.end_reason, self.end_detail = reason, detail

    def answer(self, turn: Turn, message: dict[str, Any], *, keep_truncated: bool) -> None:
        """Take the turn's answer; a truncated one ends the conversation (kept or dropped as the policy says), a tool
        call is paired with the record's or ends it."""
        recorded = self.conversation.messages[self.next_message] if self.next_message < len(
            self.conversation.messages) else None
        self.next_message += 1  # past the record's own answer (or the end)
        if turn.finish_reason == "length":
            if keep_truncated:
                self.turns.append(turn)
            self.end(TRUNCATED, f"turn {turn.turn} stopped at max_tokens ({len(turn.output_ids)} tokens) "
                                f"({'kept' if keep_truncated else 'dropped'}: sampling.truncated)")
            return
        self.turns.append(turn)
        calls = message.get("tool_calls")
        wanted = (recorded or {}).get("tool_calls")
        if not calls and not wanted:
            self.history.append(message)
            return
        if calls and not wanted:
            self.end(UNEXPECTED_TOOL, f"turn {turn.turn} called {_names(calls)}, the record answered without a call "
                                      f"(tools are not executed)")
            return
        if not same_calls(calls or [], wanted):
            self.end(TOOL_MISMATCH, f"turn {turn.turn} called {_names(calls or [])}, the record called "
                                    f"{_names(wanted)} (its results answer only those calls)")
            return
        # The recorded results answer these calls: the history keeps the record's call ids so they pair.
        self.history.append({**message, "tool_calls": wanted})


def _names(calls: list[dict[str, Any]]) -> str:
    return "[" + ", ".join(str(c.get("function", {}).get("name")) for c in calls) + "]" if calls else "nothing"


def answer_message(output_ids: list[int], tokenizer: Any, turn_ids: TurnIds | None,
                   stop_ids: tuple[int, ...]) -> dict[str, Any]:
    """The target's answer as the next prompt's history holds it."""
    ids = list(output_ids)
    if ids and ids[-1] in stop_ids:
        ids = ids[:-1]
    message: dict[str, Any] = {"role": "assistant"}
    if turn_ids is not None and turn_ids.think_end is not None and turn_ids.think_end in ids:
        cut = ids.index(turn_ids.think_end)
        reasoning = ids[1:cut] if ids and ids[0] == turn_ids.think else ids[:cut]
        message["reasoning_content"] = tokenizer.decode(reasoning)
        ids = ids[cut + 1:]
    text = tokenizer.decode(ids)
    content, calls = parse_tool_calls(text)
    message["content"] = content
    if calls:
        message["tool_calls"] = calls
    return message


def make_turn(state: State, prompt_ids: list[int], generation: Generation, seed: int, tokenizer: Any) -> Turn:
    return Turn(turn=len(state.turns), messages=list(state.history), prompt_ids=list(prompt_ids),
                output_ids=list(generation.output_ids), finish_reason=generation.finish_reason, seed=seed,
                applied=generation.applied, text=tokenizer.decode(list(generation.output_ids)))
