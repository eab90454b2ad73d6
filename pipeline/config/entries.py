"""Engine entries of the diff: `name`, `name@dtype`, or a small mapping, each one engine instance to compare.

    diff.engines=[sglang,vllm@bfloat16,hf]
    diff.engines=[{name:hf,dtype:float32,label:hf-worker,options:{python:/path/to/python}}]

An entry names only what differs from the engine's preset (conf/engine/<name>.yaml, the file `engine=<name>` selects);
`to_spec` lays it over the preset and gives the one engine description the rest of the pipeline uses (EngineSpec).
Nothing here branches on an engine's name: any registered engine works, including one added later.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from omegaconf import OmegaConf

from pipeline.core.contracts import Dtype, EngineSpec

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_KEYS = ("name", "dtype", "label", "options", "batch_size", "tp_size", "model_path")
_SPEC_FIELDS = {f.name for f in fields(EngineSpec)}
CONF_DIR = Path(__file__).resolve().parents[2] / "conf"  # the entry points' Hydra config_path


class SpecError(ValueError):
    """An engine entry that cannot be understood."""


@dataclass(frozen=True, kw_only=True)
class EngineEntry:
    """One engine of a comparison as written in the config: only what differs from its preset."""

    name: str
    dtype: str | None = None  # None: the preset's dtype
    label: str | None = None  # how reports name it; default `name@dtype` or `name`
    options: dict[str, Any] = field(default_factory=dict)  # merged over the preset's options
    batch_size: int | None = None
    tp_size: int | None = None
    model_path: str | None = None  # another checkpoint of the same model (e.g. a bf16 twin of an INT4 checkpoint)

    @property
    def display(self) -> str:
        if self.label:
            return self.label
        return f"{self.name}@{self.dtype}" if self.dtype and self.dtype != "auto" else self.name

    def identity(self) -> tuple:
        return (self.name, self.dtype, sorted(self.options.items()), self.batch_size, self.tp_size, self.model_path)


def parse_entry(value: Any, where: str) -> EngineEntry:
    """`name`, `name@dtype`, or a mapping with keys among name, dtype, label, options, batch_size, tp_size and
    model_path."""
    if isinstance(value, str):
        name, _, dtype = value.strip().partition("@")
        entry = EngineEntry(name=name, dtype=dtype or None)
    elif isinstance(value, Mapping):
        unknown = sorted(set(value) - set(_KEYS))
        if unknown:
            raise SpecError(f"{where}={dict(value)!r}: unknown key(s) {unknown}; known: {list(_KEYS)}")
        if "name" not in value:
            raise SpecError(f"{where}={dict(value)!r}: an engine entry needs a name")
        entry = EngineEntry(name=str(value["name"]), dtype=value.get("dtype"), label=value.get("label"),
                            options=dict(value.get("options") or {}), batch_size=value.get("batch_size"),
                            tp_size=value.get("tp_size"), model_path=value.get("model_path"))
    else:
        raise SpecError(f"{where}={value!r}: an engine entry is a name, name@dtype, or a mapping with a name")
    _check(entry, where, value)
    return entry


def _check(entry: EngineEntry, where: str, raw: Any) -> None:
    if not _NAME.match(entry.name):
        raise SpecError(f"{where}={raw!r}: {entry.name!r} is not an engine name")
    if entry.dtype is not None and entry.dtype not in tuple(Dtype):
        raise SpecError(f"{where}={raw!r}: dtype {entry.dtype!r} must be one of {tuple(str(d) for d in Dtype)}")
    for key in ("batch_size", "tp_size"):
        v = getattr(entry, key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise SpecError(f"{where}={raw!r}: {key} must be an integer >= 1")


def parse_entries(values: Any, where: str) -> list[EngineEntry]:
    if isinstance(values, (str, Mapping)):
        values = [values]
    return [parse_entry(v, f"{where}[{i}]") for i, v in enumerate(values or [])]


def unique(entries: list[EngineEntry]) -> list[EngineEntry]:
    """Identical entries are one engine; different entries sharing a display name are an error (name one `label`)."""
    out: list[EngineEntry] = []
    for entry in entries:
        same = [e for e in out if e.display == entry.display]
        if any(e.identity() == entry.identity() for e in same):
            continue
        if same:
            raise SpecError(f"two different engine entries are both called {entry.display!r}; give one a label "
                            f"(e.g. {{name: {entry.name}, dtype: {entry.dtype or 'auto'}, label: {entry.name}-2}})")
        out.append(entry)
    return out


def preset(name: str, conf_dir: Path = CONF_DIR) -> dict[str, Any]:
    """The engine's preset from conf/engine/<name>.yaml (interpolations resolved), or {} when there is none."""
    path = conf_dir / "engine" / f"{name}.yaml"
    if not path.is_file():
        return {}
    return OmegaConf.to_container(OmegaConf.load(path), resolve=True)  # type: ignore[return-value]


def to_spec(entry: EngineEntry) -> EngineSpec:
    """The preset of `entry.name` with the entry's own values over it; ValueError names a bad value."""
    base = {k: v for k, v in preset(entry.name).items() if k in _SPEC_FIELDS}
    base["name"] = entry.name
    base["options"] = {**(base.get("options") or {}), **entry.options}
    for key in ("dtype", "batch_size", "tp_size"):
        if getattr(entry, key) is not None:
            base[key] = getattr(entry, key)
    return EngineSpec(**base)
