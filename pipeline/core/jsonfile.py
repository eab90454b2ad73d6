"""The JSON documents the pipeline reads from outside (files a user or another process may have written or
edited), read one way: bounded in size and nesting, then accessed by typed fields. Still parsed with `json.loads`
directly: values this process serialised itself, a checkpoint's own config files (the factory's, the engines'), and
JSON strings inside records (a regeneration part's messages, a recorded or generated tool call's arguments: to be
read through here, issue #35).

A file (a draft's config.json, a run's manifest.json and run.json, an export's export.json, a unit's marker) or a
string (a safetensors metadata value, a JSON command-line argument) is refused before it is parsed when it is larger
than `max_bytes` or nests deeper than `max_depth` (a deeply nested document would otherwise end the command in a
RecursionError, in the parser or in any recursive code after it). `Fields` then reads one object's fields by type:
every error is the caller's error class (a UsageError: exit status 2) and names the file and the field's path,
`config.json: hidden_size must be an integer, got 'abc'`.

Readers that must not fail on a crash's leftovers (markers, the lock's lease) use `read_lenient`: None for anything
that is not a bounded, well-formed object.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable, Mapping

from pipeline.core.cli import UsageError
from pipeline.core.io import read_bounded

MAX_BYTES = 16 << 20  # a config, start record, sidecar or marker: kilobytes; a manifest passes its own bound
MAX_DEPTH = 64  # no file the pipeline writes or reads nests deeper than about 8
_MISSING = object()
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)  # a JSON string, escapes included (no backtracking blow-up)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


class JsonFileError(UsageError, ValueError):
    """A JSON document that cannot be read, or a field of the wrong type (named)."""


def nesting(raw: bytes, limit: int) -> int:
    """How deep `raw`'s arrays and objects nest (brackets inside strings do not count), counted up to `limit + 1`."""
    depth = deepest = 0
    for byte in _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS):
        depth += 1 if byte in b"[{" else -1
        if depth > deepest:
            deepest = depth
            if deepest > limit:
                break
    return deepest


def _parse(raw: bytes, where: str, error: type[Exception], max_bytes: int, max_depth: int) -> Any:
    if len(raw) > max_bytes:
        raise error(f"{where} is larger than {max_bytes} bytes, the most read for it")
    if nesting(raw, max_depth) > max_depth:
        raise error(f"{where} nests arrays or objects deeper than {max_depth} levels")
    try:
        return json.loads(raw)  # bytes: UTF-8 (a BOM allowed), UTF-16 or UTF-32, as json detects them
    except UnicodeDecodeError as exc:
        raise error(f"{where} is not readable JSON: not UTF-8 ({exc})") from None
    except (json.JSONDecodeError, RecursionError) as exc:  # RecursionError: a backstop, the scan above bounds depth
        raise error(f"{where} is not readable JSON: {exc}") from None


def parse(text: str | bytes, error: type[Exception] = JsonFileError, *, where: str, max_bytes: int = MAX_BYTES,
          max_depth: int = MAX_DEPTH) -> Any:
    """The JSON value in `text` (a metadata value, an argument); `error` naming `where` when it is not one."""
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    return _parse(raw, where, error, max_bytes, max_depth)




def read(path: Path, error: type[Exception] = JsonFileError, *, prefix: str = "", missing_hint: str = "",
         max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON value in the file `path`; `error` (its message starting with `prefix`, naming the file) when it is
    missing, unreadable, too large, too deeply nested or not JSON. An OSError while reading names the file."""
    path = Path(path)
    if not path.is_file():
        raise error(f"{prefix}{path} does not exist{missing_hint}")
    try:
        raw = read_bounded(path, max_bytes)
    except OSError as exc:
        raise error(f"{prefix}{path} is not readable: {exc.strerror or exc}") from None
    return _parse(raw, f"{prefix}{path}", error, max_bytes, max_depth)


def read_object(path: Path, error: type[Exception] = JsonFileError, **kwargs: Any) -> dict[str, Any]:
    """`read`, for a file that must hold a JSON object."""
    value = read(path, error, **kwargs)
    if not isinstance(value, dict):
        raise error(f"{kwargs.get('prefix', '')}{path} holds a JSON {_kind_of(value)}, not an object")
    return value


def read_fields(path: Path, error: type[Exception] = JsonFileError, **kwargs: Any) -> Fields:
    """`read_object`, as typed fields whose errors name `path`."""
    return Fields(read_object(path, error, **kwargs), file=f"{kwargs.get('prefix', '')}{path}", error=error)


def read_lenient(path: Path, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH) -> dict | None:
    """The JSON object in `path`; None when there is none, or it is torn, too large, too deep or not an object (a
    crash's leftover, a foreign file: the caller treats it as absent)."""
    try:
        value = _parse(read_bounded(Path(path), max_bytes), str(path), JsonFileError, max_bytes, max_depth)
    except (OSError, JsonFileError):
        return None
    return value if isinstance(value, dict) else None


def _kind_of(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")


def shown(value: Any, limit: int = 60) -> str:
    """A field's value as an error message quotes it: null/true/false as JSON says them, anything else by repr,
    cut at `limit` characters."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


KINDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "int": ("an integer", _is_int),
    "str": ("a string", lambda v: isinstance(v, str)),
    "bool": ("true or false", lambda v: isinstance(v, bool)),
    "object": ("an object", lambda v: isinstance(v, dict)),
    "list": ("an array", lambda v: isinstance(v, list)),
}


class Fields:
    """Typed access to one JSON object's fields; every error is `error` naming the file and the field's path.

    `optional=True`: an absent or null field is None. Otherwise an absent field is "missing" and a null one has the
    wrong type. An integer is never a boolean, nor a float that happens to be whole."""

    def __init__(self, value: Mapping[str, Any], *, file: str, error: type[Exception] = JsonFileError,
                 at: str = "") -> None:
        self.value, self.file, self.error, self.at = value, file, error, at

    def path(self, key: str | int) -> str:
        return f"{self.at}[{key}]" if isinstance(key, int) else f"{self.at}.{key}" if self.at else key

    def fail(self, key: str | int, what: str) -> Exception:
        return self.error(f"{self.file}: {self.path(key)} {what}")

    def has(self, key: str) -> bool:
        return key in self.value

    def _get(self, key: str, kind: str, optional: bool) -> Any:
        value = self.value.get(key, _MISSING)
        if value is _MISSING or (value is None and optional):
            if optional:
                return None
            raise self.fail(key, f"is missing (it must be {KINDS[kind][0]})")
        return self._check(key, value, kind)

    def _check(self, key: str | int, value: Any, kind: str) -> Any:
        name, ok = KINDS[kind]
        if not ok(value):
            raise self.fail(key, f"must be {name}, got {shown(value)}")
        return value

    def int(self, key: str, *, optional: bool = False, minimum: int | None = None) -> int | None:
        value = self._get(key, "int", optional)
        if value is not None and minimum is not None and value < minimum:
            raise self.fail(key, f"must be an integer >= {minimum}, got {shown(value)}")
        return value

    def str(self, key: str, *, optional: bool = False) -> str | None:
        return self._get(key, "str", optional)

    def bool(self, key: str, *, optional: bool = False) -> bool | None:
        return self._get(key, "bool", optional)

    def obj(self, key: str, *, optional: bool = False) -> Fields | None:
        value = self._get(key, "object", optional)
        return None if value is None else Fields(value, file=self.file, error=self.error, at=self.path(key))

    def list(self, key: str, of: str | None = None, *, optional: bool = False) -> list | None:
        """An array; with `of` ('int', 'str', 'bool', 'object', 'list') every element of that type."""
        value = self._get(key, "list", optional)
        if value is not None and of is not None:
            items = Fields({}, file=self.file, error=self.error, at=self.path(key))
            for i, item in enumerate(value):
                items._check(i, item, of)
        return value

    def objects(self, key: str, *, optional: bool = False) -> list[Fields]:
        """An array of objects, each as Fields (`slots[2].point`)."""
        value = self.list(key, "object", optional=optional) or []
        return [Fields(item, file=self.file, error=self.error, at=f"{self.path(key)}[{i}]")
                for i, item in enumerate(value)]
