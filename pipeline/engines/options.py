"""Engine options: one frozen dataclass per engine, parsed from `engine.options` (or a diff entry's `options`).

The same class checks the options twice: in the driver when the config is resolved (`pipeline.compare.preflight`, the
diff's entries in `pipeline.compare.lineup`), so that a misspelled or wrongly typed option is a configuration error
before any engine starts; and in the adapter, which reads its typed fields. So these modules import only the standard
library: the driver reads them without importing an engine (or torch), and the engines' own virtualenvs (vLLM's,
SGLang's), where the adapters read them, have no Hydra or OmegaConf.

A field's `doc` metadata (`option(default, doc)`) is its documentation; conf/engine/*.yaml points here.
"""
from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field, fields
from typing import Any, Literal, Mapping, TypeVar

T = TypeVar("T", bound="EngineOptions")


class OptionsError(ValueError):
    """An option an engine does not take, or a value it cannot take; the message names the option's config path."""


class InvalidOption(ValueError):
    """Raised by an options class's own checks (`__post_init__`): which field, and why its value cannot run."""

    def __init__(self, name: str, value: Any, why: str) -> None:
        super().__init__(f"{name}={value!r}: {why}")
        self.name, self.value, self.why = name, value, why


def option(default: Any, doc: str) -> Any:
    """A dataclass field with its documentation (mutable defaults are written as None and resolved by the adapter)."""
    return field(default=default, metadata={"doc": doc})


@dataclass(frozen=True, kw_only=True)
class EngineOptions:
    """What every engine takes; an engine's own class adds its options."""

    python: str | None = option(None, "the interpreter to run the engine in (a worker process when it is not this "
                                      "one); None = the environment the adapter names (`Engine.environment`)")

    @classmethod
    def parse(cls: type[T], options: Mapping[str, Any], where: str = "engine.options", engine: str = "") -> T:
        """The typed options; OptionsError names `where.<key>` for an unknown key (with the closest valid one) and
        for a value of the wrong type or out of range. `engine` names the engine in the unknown-key message."""
        unknown = [key for key in options if key not in cls.names()]
        if unknown:
            raise OptionsError("; ".join(_unknown_message(cls, str(key), where, engine) for key in unknown))
        hints = typing.get_type_hints(cls)
        values = {}
        for key, value in options.items():
            if not _conforms(value, hints[key]):
                raise OptionsError(f"{where}.{key}={value!r}: must be {_describe(hints[key])}")
            values[key] = float(value) if _is_float(hints[key]) and isinstance(value, int) else value
        try:
            return cls(**values)
        except InvalidOption as e:  # named with the value as written (before an integer became a float)
            raise OptionsError(f"{where}.{e.name}={options.get(e.name, e.value)!r}: {e.why}") from e

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def docs(cls) -> dict[str, str]:
        """Each option's documentation, in declaration order."""
        return {f.name: f.metadata.get("doc", "") for f in fields(cls)}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _unknown_message(cls: type[EngineOptions], key: str, where: str, engine: str) -> str:
    close = difflib.get_close_matches(key, cls.names(), n=1)
    hint = f"did you mean {where}.{close[0]}?" if close else f"valid options: {', '.join(cls.names())}"
    return f"unknown option {where}.{key}{f' for engine={engine}' if engine else ''} ({hint})"


def _arms(annotation: Any) -> tuple[Any, ...]:
    """The alternatives of `X | Y` / `Optional[X]`, else the annotation alone."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _is_float(annotation: Any) -> bool:
    return float in _arms(annotation)


def _conforms(value: Any, annotation: Any) -> bool:
    """Whether a config value (YAML/JSON: None, bool, int, float, str, list, dict) fits the annotation."""
    for arm in _arms(annotation):
        origin, args = typing.get_origin(arm), typing.get_args(arm)
        if arm is Any or (arm is type(None) and value is None):
            return True
        if origin is Literal and value in args and not isinstance(value, bool):
            return True
        if arm in (int, float, str) and _scalar(value, arm):
            return True
        if arm is bool and isinstance(value, bool):
            return True
        if origin is list and isinstance(value, (list, tuple)) and all(_conforms(v, args[0]) for v in value):
            return True
        if origin is dict and isinstance(value, Mapping) and all(
                _conforms(k, args[0]) and _conforms(v, args[1]) for k, v in value.items()):
            return True
    return False


def _scalar(value: Any, kind: type) -> bool:
    if isinstance(value, bool):  # YAML's true is not the integer 1
        return False
    return isinstance(value, (int, float) if kind is float else kind)


def _describe(annotation: Any) -> str:
    words = []
    for arm in _arms(annotation):
        origin, args = typing.get_origin(arm), typing.get_args(arm)
        if origin is Literal:
            words.append("one of " + ", ".join(repr(a) for a in args))
        elif origin is list:
            words.append(f"a list of {_describe(args[0]).removeprefix('a ').removeprefix('an ')}s")
        elif origin is dict:
            words.append("a mapping")
        else:
            words.append(_WORDS.get(arm, str(arm)))
    return " or ".join(words)


_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false", type(None): "null",
          Any: "any value"}
