"""Engines by name: the registry, and `make_engine`, which runs an adapter here or in its own virtualenv's worker.

name -> "module:Class"; adapters are imported only when used, so a missing optional dependency fails at engine start
with its install command, not at import of the pipeline. `register` adds one (a plugin, or a test's engine) and refuses
to rebind a name.

Each built-in engine's options class (`pipeline.engines.options`) is named beside its adapter, in a module that imports
only the standard library: `check_options` refuses a misspelled or mistyped option when the config is resolved,
without importing the adapter. The adapter declares the same class (`Engine.options_type`) and parses the options
again where it runs; a registered engine's options are its adapter's `options_type`.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Sequence

from pipeline.core.contracts import EngineSpec
from pipeline.engines.base import Engine, Task
from pipeline.engines.options import EngineOptions
from pipeline.engines.process.remote import RemoteEngine
from pipeline.points import Point

_REGISTRY: dict[str, str] = {
    "hf": "pipeline.engines.hf:HFEngine",
    "vllm": "pipeline.engines.vllm.adapter:VLLMEngine",
    "sglang": "pipeline.engines.sglang.adapter:SGLangEngine",
    "vllm-speculate": "pipeline.engines.vllm.speculate:SpeculativeVLLM",
}
_OPTIONS: dict[str, str] = {
    "hf": "pipeline.engines.hf_options:HFOptions",
    "vllm": "pipeline.engines.vllm.options:VLLMOptions",
    "sglang": "pipeline.engines.sglang.options:SGLangOptions",
    "vllm-speculate": "pipeline.engines.vllm.options:SpeculateOptions",
}
# Engines that measure (pipeline.accept) rather than capture or regenerate: made by name, never a job's `engine=`.
_MEASURING = ("vllm-speculate",)
REPO_ROOT = Path(__file__).resolve().parents[2]


def register(name: str, target: str) -> None:
    if _REGISTRY.get(name) not in (None, target):
        raise ValueError(f"engine {name!r} is already registered as {_REGISTRY[name]}")
    _REGISTRY[name] = target


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def engine_names() -> list[str]:
    """The engines a job's config may name."""
    return sorted(n for n in _REGISTRY if n not in _MEASURING)


def check_name(name: str, *, allow_measuring: bool = False) -> None:
    """ValueError unless `name` is a registered engine; a measuring one (accept's) only with `allow_measuring`."""
    if name in _MEASURING and not allow_measuring:
        raise ValueError(f"engine={name!r} measures acceptance (python -m pipeline.accept); it captures and "
                         f"generates nothing; known engines: {', '.join(engine_names())}")
    if name not in _REGISTRY:
        raise ValueError(f"engine={name!r} is unknown; known engines: {', '.join(engine_names())}")


def _load(target: str) -> type:
    module_name, cls_name = target.split(":")
    return getattr(importlib.import_module(module_name), cls_name)


def engine_class(name: str) -> type[Engine]:
    check_name(name, allow_measuring=True)
    return _load(_REGISTRY[name])


def options_class(name: str) -> type[EngineOptions]:
    """The engine's options class; a built-in engine's is read without importing its adapter."""
    check_name(name, allow_measuring=True)
    if name in _OPTIONS:
        return _load(_OPTIONS[name])
    return engine_class(name).options_type or EngineOptions


def options_classes() -> dict[str, type[EngineOptions]]:
    """Every built-in engine's options class, by engine name (the docs' configuration reference lists them)."""
    return {name: options_class(name) for name in _OPTIONS}


def check_options(spec: EngineSpec, where: str) -> None:
    """OptionsError (a ValueError) naming `<where>.options.<key>` for an option the engine does not take, with the
    closest valid one, or for a value it cannot take; ValueError for an unknown engine."""
    options_class(spec.name).parse(spec.options, f"{where}.options", engine=spec.name)


def environment_python(name: str) -> Path | None:
    """The interpreter of the virtualenv engine `name`'s adapter runs in (`.venv-vllm/bin/python`), whether or not
    it exists; None for an adapter that runs in the pipeline's own environment. What every caller that runs code in
    an engine's environment (a worker, the doctor's load probes) asks."""
    environment = engine_class(name).environment
    return None if environment is None else _venv_python(environment)


def _venv_python(environment: str) -> Path:
    return REPO_ROOT / environment / "bin" / "python"


def engine_python(cls: type[Engine], options: dict) -> str | None:
    """The interpreter an engine must run in (`options.python` overrides), or None for this very process."""
    if cls.environment is None and "python" not in options:
        return None
    exe = Path(options.get("python") or _venv_python(str(cls.environment)))
    if Path(sys.prefix).resolve() == exe.parent.parent.resolve():
        return None
    return str(exe)


def make_engine(spec: EngineSpec, *, model_path: str, points: Sequence[Point], num_layers: int,
                trust_remote_code: bool = False, max_seq_len: int | None = None, task: Task = "capture") -> Engine:
    """An engine ready to start: in this process, or in a worker running in the engine's own environment;
    `max_seq_len`: the longest sequence the caller will send, when it knows (`Engine.max_seq_len`); `task`: what it
    is started for (`Engine.task`)."""
    cls = engine_class(spec.name)
    exe = engine_python(cls, spec.options)
    if exe is None:
        return cls(spec, model_path=model_path, points=points, num_layers=num_layers,
                   trust_remote_code=trust_remote_code, max_seq_len=max_seq_len, task=task)
    if not Path(exe).exists():
        raise FileNotFoundError(f"engine={spec.name!r} runs in its own environment, but {exe} does not exist; "
                                f"run scripts/setup.sh (or set engine.options.python)")
    return RemoteEngine(spec, target=_REGISTRY[spec.name], python=exe, model_path=model_path, points=points,
                        num_layers=num_layers, trust_remote_code=trust_remote_code, max_seq_len=max_seq_len,
                        task=task)
