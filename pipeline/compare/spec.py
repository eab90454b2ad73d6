"""Engine entries of the diff: `name`, `name@dtype`, or a small dict, each one engine instance to compare.

    diff.engines=[sglang,vllm@bfloat16,hf]
    diff.engines=[{name:hf,dtype:float32,label:hf-worker,options:{python:/path/to/python}}]

An entry starts from the engine's own preset (conf/engine/<name>.yaml, the file `engine=<name>` selects) and overrides
what it names. Nothing here branches on an engine's name: any registered engine works, including one added later.
This module imports nothing heavy: config validation uses it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from pipeline.config import DTYPES

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_KEYS = ("name", "dtype", "label", "options", "batch_size", "tp_size", "model_path")
CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


class SpecError(ValueError):
    """An engine entry that cannot be understood."""


@dataclass(frozen=True, kw_only=True)
class EngineSpec:
    """One engine instance of a comparison, as written in the config (before its preset is applied)."""

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


def parse_spec(value: Any, where: str) -> EngineSpec:
    """`name`, `name@dtype`, or a mapping with keys among name, dtype, label, options, batch_size, tp_size and
    model_path."""
    if isinstance(value, str):
        name, _, dtype = value.strip().partition("@")
        spec = EngineSpec(name=name, dtype=dtype or None)
    elif isinstance(value, Mapping):
        unknown = sorted(set(value) - set(_KEYS))
        if unknown:
            raise SpecError(f"{where}={dict(value)!r}: unknown key(s) {unknown}; known: {list(_KEYS)}")
        if "name" not in value:
            raise SpecError(f"{where}={dict(value)!r}: an engine entry needs a name")
        spec = EngineSpec(name=str(value["name"]), dtype=value.get("dtype"), label=value.get("label"),
                          options=dict(value.get("options") or {}), batch_size=value.get("batch_size"),
                          tp_size=value.get("tp_size"), model_path=value.get("model_path"))
    else:
        raise SpecError(f"{where}={value!r}: an engine entry is a name, name@dtype, or a mapping with a name")
    _check(spec, where, value)
    return spec


def _check(spec: EngineSpec, where: str, raw: Any) -> None:
    if not _NAME.match(spec.name):
        raise SpecError(f"{where}={raw!r}: {spec.name!r} is not an engine name")
    if spec.dtype is not None and spec.dtype not in DTYPES:
        raise SpecError(f"{where}={raw!r}: dtype {spec.dtype!r} must be one of {DTYPES}")
    for key in ("batch_size", "tp_size"):
        v = getattr(spec, key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise SpecError(f"{where}={raw!r}: {key} must be an integer >= 1")


def parse_specs(values: Any, where: str) -> list[EngineSpec]:
    if isinstance(values, (str, Mapping)):
        values = [values]
    return [parse_spec(v, f"{where}[{i}]") for i, v in enumerate(values or [])]


def unique(specs: list[EngineSpec]) -> list[EngineSpec]:
    """Identical entries are one engine; different entries sharing a display name are an error (name one `label`)."""
    out: list[EngineSpec] = []
    for spec in specs:
        same = [s for s in out if s.display == spec.display]
        if any(s.identity() == spec.identity() for s in same):
            continue
        if same:
            raise SpecError(f"two different engine entries are both called {spec.display!r}; give one a label "
                            f"(e.g. {{name: {spec.name}, dtype: {spec.dtype or 'auto'}, label: {spec.name}-2}})")
        out.append(spec)
    return out


def preset(name: str, conf_dir: Path = CONF_DIR) -> dict[str, Any]:
    """The engine's preset from conf/engine/<name>.yaml (interpolations resolved), or {} when there is none."""
    from omegaconf import OmegaConf

    path = conf_dir / "engine" / f"{name}.yaml"
    if not path.is_file():
        return {}
    node = OmegaConf.load(path)
    return OmegaConf.to_container(node, resolve=True)  # type: ignore[return-value]


def with_label(spec: EngineSpec, label: str) -> EngineSpec:
    return replace(spec, label=label)
