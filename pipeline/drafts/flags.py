"""The serving command line's speculative flags, as a user pastes them, and the ones that override each other.

SGLang 0.5.23 (sglang/srt/arg_groups/speculative_hook.py, `_handle_eagle_family`): with `--speculative-eagle-topk 1`
`--speculative-num-draft-tokens` is replaced by `--speculative-num-steps + 1` (a warning in the log, nothing else);
`--speculative-eagle-topk` or `--speculative-num-draft-tokens` without `--speculative-num-steps` fails an assertion
(the three are auto-chosen together or not at all); `--speculative-use-rejection-sampling` needs topk 1. Only
`--speculative-algorithm EAGLE3` switches aux capture on.
vLLM 0.32 (vllm/config/speculative.py): `--speculative-config JSON`; `method` decides the proposer (without it, the
draft path's name decides: "eagle3" in it means EAGLE-3, "eagle-" EAGLE-1, else another method); a draft without
`num_speculative_tokens` is refused; the old `--speculative-model` / `--num-speculative-tokens` flags are gone.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from pipeline.core.cli import UsageError
from pipeline.core.jsonfile import parse as parse_json


class FlagsError(UsageError, ValueError):
    """--server-args that cannot be split into words."""


@dataclass(kw_only=True)
class Flags:
    raw: dict[str, str | bool] = field(default_factory=dict)  # --name (underscores as dashes) -> value
    speculative_config: dict[str, Any] | None = None  # vLLM's JSON, parsed
    problems: list[str] = field(default_factory=list)  # what the server refuses to start with
    overrides: list[str] = field(default_factory=list)  # settings silently replaced by another

    def get(self, name: str) -> str | bool | None:
        return self.raw.get(name)


def split(text: str) -> dict[str, str | bool]:
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise FlagsError(f"--server-args: {exc}") from None
    out: dict[str, str | bool] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if word.startswith("--"):
            name, _, value = word[2:].partition("=")
            name = name.replace("_", "-")
            if value:
                out[name] = value
            elif i + 1 < len(words) and not words[i + 1].startswith("--"):
                out[name] = words[i + 1]
                i += 1
            else:
                out[name] = True
        i += 1
    return out


def _int(flags: Flags, name: str) -> int | None:
    value = flags.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        flags.problems.append(f"--{name} {value!r} is not an integer")
        return None


def _sglang(flags: Flags) -> None:
    algorithm = flags.get("speculative-algorithm")
    if algorithm is not None and str(algorithm).upper() != "EAGLE3":
        flags.problems.append(f"--speculative-algorithm {algorithm}: only EAGLE3 switches aux capture on and builds an "
                              "EAGLE-3 draft class; use --speculative-algorithm EAGLE3")
    steps, topk, tokens = (_int(flags, n) for n in ("speculative-num-steps", "speculative-eagle-topk",
                                                    "speculative-num-draft-tokens"))
    if steps is None and (topk is not None or tokens is not None):
        flags.problems.append("--speculative-eagle-topk / --speculative-num-draft-tokens without "
                              "--speculative-num-steps: SGLang 0.5.23 fails an assertion (it auto-chooses the three "
                              "together); set --speculative-num-steps too")
    if topk == 1 and steps is not None and tokens is not None and tokens != steps + 1:
        flags.overrides.append(f"--speculative-num-draft-tokens {tokens} is replaced by {steps + 1} "
                               f"(--speculative-num-steps {steps} + 1) because --speculative-eagle-topk is 1; set "
                               f"--speculative-num-draft-tokens {steps + 1}, or raise --speculative-eagle-topk to "
                               f"draft a tree of {tokens} tokens")
    if flags.get("speculative-use-rejection-sampling") and topk not in (None, 1):
        flags.problems.append(f"--speculative-use-rejection-sampling needs --speculative-eagle-topk 1 (got {topk})")


def _vllm(flags: Flags) -> None:
    for old in ("speculative-model", "num-speculative-tokens", "speculative-draft-tensor-parallel-size"):
        if old in flags.raw:
            flags.problems.append(f"--{old} is not a vLLM 0.32 flag (argparse refuses it): put it in "
                                  f"--speculative-config as JSON")
    text = flags.get("speculative-config")
    if text is None:
        return
    try:
        config = parse_json(str(text), ValueError, where="the value")  # bounded: a deeply nested value is named too
    except ValueError as exc:
        flags.problems.append(f"--speculative-config is not JSON ({exc}); quote it as one word: "
                              "--speculative-config '{\"method\": \"eagle3\", ...}'")
        return
    if not isinstance(config, dict):
        flags.problems.append("--speculative-config must be a JSON object")
        return
    flags.speculative_config = config
    method, model = config.get("method"), str(config.get("model") or "")
    if method is None and "eagle3" not in model.lower():
        flags.problems.append(f"--speculative-config has no method and its model path {model!r} does not contain "
                              "'eagle3': vLLM will not pick EAGLE-3 (no aux capture); add \"method\": \"eagle3\"")
    elif method is not None and method != "eagle3":
        flags.problems.append(f"--speculative-config method {method!r}: only \"eagle3\" switches aux capture on; "
                              "set \"method\": \"eagle3\"")
    if config.get("num_speculative_tokens") is None:
        flags.problems.append("--speculative-config has no num_speculative_tokens: vLLM refuses an EAGLE-3 draft "
                              "without it")


def parse(text: str | None, framework: str) -> Flags:
    flags = Flags(raw=split(text) if text else {})
    (_sglang if framework == "sglang" else _vllm)(flags)
    return flags


def draft_path_flag(flags: Flags, framework: str) -> str | None:
    if framework == "sglang":
        value = flags.get("speculative-draft-model-path") or flags.get("speculative-draft")
        return str(value) if value not in (None, True) else None
    return str(flags.speculative_config.get("model")) if flags.speculative_config and \
        flags.speculative_config.get("model") else None


def backend_flag(flags: Flags, framework: str) -> str | None:
    value = flags.get("attention-backend")  # the same flag name in both servers
    return None if value in (None, True) else str(value)
