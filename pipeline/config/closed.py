"""The schema is closed: a key no dataclass of the schema declares is an error, also when added with `+`.

Hydra's `+key=value` (and `++`) adds a key through OmegaConf's open_dict, which lifts struct mode for that one merge,
so a misspelled `+runner.max_samples_per_shrad=8` composes, is set as a stray attribute by `OmegaConf.to_object`, and
is otherwise ignored. Free-form nodes (a `dict` or `Any` field such as `engine.options` or a `diff.engines` entry)
stay open here; only the nodes typed by a schema dataclass are checked, at any depth. Engine options are checked by
the engine's own options class (`pipeline.engines.options`) when the run is resolved.

A misspelled plain override (`runer.overlap_writes=true`) never reaches the composed config: Hydra refuses it while
composing, exit status 1, and advises `+` (which the closed schema refuses in turn). `unknown_override_keys` names it
before Hydra runs, with the same message and exit status as every other configuration error.
"""
from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Iterable, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf


def _unknown(node: DictConfig, path: str) -> list[tuple[str, list[str]]]:
    """(dotted key, the valid keys beside it) of every key a schema dataclass does not declare, in config order."""
    found = []
    schema = OmegaConf.get_type(node)
    fields = [f.name for f in dataclasses.fields(schema)] if dataclasses.is_dataclass(schema) else None
    for key, value in node.items_ex(resolve=False):
        dotted = f"{path}.{key}" if path else str(key)
        if fields is not None and key not in fields:
            found.append((dotted, fields))
        elif isinstance(value, DictConfig):
            found += _unknown(value, dotted)
    return found


def _unknown_path(schema: object, dotted: str) -> tuple[str, list[str]] | None:
    """(the first undeclared prefix of `dotted`, the valid keys beside it), walking the schema's types; None when every
    part is declared or the walk reaches a free-form field (a scalar, a list, a dict of scalars, Any)."""
    parts = dotted.split(".")
    for depth, part in enumerate(parts):
        schema = _optional_of(schema)
        if typing.get_origin(schema) is dict:  # a dict of dataclasses (diff.thresholds): any key, typed values
            schema = typing.get_args(schema)[1]
            continue
        if not dataclasses.is_dataclass(schema):
            return None
        fields = [f.name for f in dataclasses.fields(schema)]
        if part not in fields:
            return ".".join(parts[:depth + 1]), fields
        schema = typing.get_type_hints(schema)[part]
    return None


def _optional_of(annotation: object) -> object:
    """`Foo` for `Optional[Foo]`, else the annotation itself."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(annotation) if a is not type(None)]
        return inner[0] if len(inner) == 1 else annotation
    return annotation


def unknown_override_keys(schema: type, overrides: Sequence[str], groups: Iterable[str]) -> str | None:
    """The message `unknown_keys_message` would give for the plain `key=value` overrides (no `+`, `++` or `~`: the
    composed config's check sees those) whose key the schema does not declare; a config group's choice
    (`model=tiny_llama`), Hydra's own keys and what Hydra cannot parse are left to Hydra."""
    groups = set(groups)
    found = []
    for text in overrides:
        if text.startswith("-"):
            continue
        try:
            override = OverridesParser.create().parse_override(text)
        except HydraException:
            continue
        key = override.key_or_group
        if override.is_add() or override.is_force_add() or override.is_delete() or override.package is not None:
            continue
        if key.split(".")[0] == "hydra" or key in groups:
            continue
        if (hit := _unknown_path(schema, key)) is not None:
            found.append(hit)
    return _message(found)


def unknown_keys_message(cfg: DictConfig) -> str | None:
    """One line naming every unknown key and the closest valid one; None when every key is declared."""
    return _message(_unknown(cfg, ""))


def _message(found: list[tuple[str, list[str]]]) -> str | None:
    parts = []
    for dotted, fields in found:
        parent, _, leaf = dotted.rpartition(".")
        prefix = f"{parent}." if parent else ""
        close = difflib.get_close_matches(leaf, fields, n=1)
        hint = f"did you mean {prefix}{close[0]}?" if close else f"valid keys{' under ' + parent if parent else ''}: " \
            f"{', '.join(fields)}"
        parts.append(f"{dotted} ({hint})")
    if not parts:
        return None
    return f"unknown config key{'s' if len(parts) > 1 else ''} {'; '.join(parts)}"
