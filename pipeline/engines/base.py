"""The engine contract: start from a model, capture canonical points for a batch, report what really ran.

Every engine (hf, vllm, sglang) implements `Engine` in its own module and registers under its name; the orchestration
code never branches on an engine's name. Heavy imports (transformers, vllm, sglang) happen inside the adapters.
"""
from __future__ import annotations

import abc
import importlib
import sys
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

import numpy as np
import torch

from pipeline.data.sample import PreparedSample
from pipeline.points import Point


@dataclass(frozen=True, kw_only=True)
class Capture:
    """Hidden states of one sample at the requested points, padding stripped.

    hidden_states_TPH: [T tokens, P points in request order, H hidden], in the engine's compute dtype.
    input_ids_T: the token ids the engine really consumed (int64), checked against the prepared ids before writing.
    """

    sample_id: str
    input_ids_T: np.ndarray
    hidden_states_TPH: torch.Tensor


@dataclass(kw_only=True)
class PointSource:
    """How one canonical point was obtained from an engine (goes into provenance)."""

    point: str  # canonical label, e.g. "b3" or "final_norm"
    native_id: int | str | None  # the id in the framework's own numbering, None when not captured natively
    method: str  # e.g. "hf output_hidden_states[3]", "forward hook on model.norm input"


@dataclass(kw_only=True)
class EngineInfo:
    """What the engine really ran, read from the running engine, not from the config that asked for it."""

    framework: str
    framework_version: str
    dtype: str
    quantization: dict[str, Any]  # method, kernel, whether weights were dequantized at load, ...
    attention_backend: str
    parallel: dict[str, int]  # tp, pp, dp, ...
    libraries: dict[str, str]  # versions of torch, transformers, ...
    points: list[PointSource] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


class EngineStartError(RuntimeError):
    """The primary engine did not start, so nothing was written. Locally the chained exception holds the engine's
    traceback; on Ray, the actor's log does."""


def error_summary(e: BaseException) -> str:
    """What went wrong in one line: an engine worker's error without its traceback, else `Type: message`."""
    summary = getattr(e, "summary", None) or f"{type(e).__name__}: {e}"
    return " ".join(summary.split())


class Engine(abc.ABC):
    """One loaded model in one framework. Use as a context manager: `with engine: engine.capture(...)`."""

    name: ClassVar[str]
    # The virtualenv (relative to the repository root) this adapter must run in, or None for the pipeline's own.
    # vLLM and SGLang pin their own torch builds; `make_engine` runs such adapters in a worker process there.
    environment: ClassVar[str | None] = None

    def __init__(self, *, model_path: str, dtype: str, points: Sequence[Point], num_layers: int,
                 options: dict[str, Any]) -> None:
        self.model_path = model_path
        self.dtype = dtype
        self.points = list(points)
        self.num_layers = num_layers
        self.options = dict(options)

    @abc.abstractmethod
    def start(self) -> None:
        """Load the model (slow; once per run)."""

    @abc.abstractmethod
    def capture(self, samples: Sequence[PreparedSample]) -> list[Capture]:
        """Run one forward pass over the batch; one Capture per sample, in input order."""

    @abc.abstractmethod
    def info(self) -> EngineInfo:
        """Provenance of the running engine (valid after start)."""

    def close(self) -> None:
        """Release the model and any worker processes."""

    def __enter__(self) -> "Engine":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# name -> "module:Class"; adapters are imported only when used, so a missing optional dependency
# fails at engine start with its install command, not at import of the pipeline.
# An entry of None is an engine whose adapter has not landed yet: configs naming it validate, starting it fails clearly.
_REGISTRY: dict[str, str | None] = {
    "hf": "pipeline.engines.hf:HFEngine",
    "vllm": "pipeline.engines.vllm:VLLMEngine",
    "sglang": "pipeline.engines.sglang:SGLangEngine",
}


def register(name: str, target: str) -> None:
    if _REGISTRY.get(name) not in (None, target):
        raise ValueError(f"engine {name!r} is already registered as {_REGISTRY[name]}")
    _REGISTRY[name] = target


def engine_names() -> list[str]:
    return sorted(_REGISTRY)


def engine_class(name: str) -> type[Engine]:
    if name not in _REGISTRY:
        raise ValueError(f"engine={name!r} is unknown; known engines: {', '.join(engine_names())}")
    target = _REGISTRY[name]
    if target is None:
        raise NotImplementedError(f"engine={name!r}: its adapter is not part of this version yet; "
                                  f"engines that run now: {', '.join(n for n in engine_names() if _REGISTRY[n])}")
    module_name, cls_name = target.split(":")
    return getattr(importlib.import_module(module_name), cls_name)


REPO_ROOT = Path(__file__).resolve().parents[2]


def engine_python(cls: type[Engine], options: dict[str, Any]) -> str | None:
    """The interpreter an engine must run in (`options.python` overrides), or None for this very process."""
    if cls.environment is None and "python" not in options:
        return None
    exe = Path(options.get("python") or REPO_ROOT / str(cls.environment) / "bin" / "python")
    if Path(sys.prefix).resolve() == exe.parent.parent.resolve():
        return None
    return str(exe)


def make_engine(name: str, **kwargs: Any) -> Engine:
    """An engine ready to start: in this process, or in a worker running in the engine's own environment."""
    cls = engine_class(name)
    exe = engine_python(cls, kwargs.get("options", {}))
    if exe is None:
        return cls(**kwargs)
    if not Path(exe).exists():
        raise FileNotFoundError(f"engine={name!r} runs in its own environment, but {exe} does not exist; "
                                f"run scripts/setup.sh (or set engine.options.python)")
    from pipeline.engines.remote import RemoteEngine

    return RemoteEngine(target=_REGISTRY[name], python=exe, **kwargs)
