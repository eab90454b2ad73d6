"""The schema is closed: a key no dataclass of the schema declares is an error, also when added with `+`.

Hydra's `+key=value` (and `++`) adds a key through OmegaConf's open_dict, which lifts struct mode for that one merge,
so a misspelled `+runner.max_samples_per_shrad=8` composes, is set as a stray attribute by `OmegaConf.to_object`, and
is otherwise ignored. Free-form nodes (a `dict` or `Any` field such as `engine.options` or a `diff.engines` entry)
stay open; only the nodes typed by a schema dataclass are checked, at any depth.
"""
from __future__ import annotations

import dataclasses
import difflib

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


def unknown_keys_message(cfg: DictConfig) -> str | None:
    """One line naming every unknown key and the closest valid one; None when every key is declared."""
    parts = []
    for dotted, fields in _unknown(cfg, ""):
        parent, _, leaf = dotted.rpartition(".")
        prefix = f"{parent}." if parent else ""
        close = difflib.get_close_matches(leaf, fields, n=1)
        hint = f"did you mean {prefix}{close[0]}?" if close else f"valid keys{' under ' + parent if parent else ''}: " \
            f"{', '.join(fields)}"
        parts.append(f"{dotted} ({hint})")
    if not parts:
        return None
    return f"unknown config key{'s' if len(parts) > 1 else ''} {'; '.join(parts)}"
