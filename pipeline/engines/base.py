"""The engine contract: start from a model, capture canonical points for a batch, report what really ran.

Every engine (hf, vllm, sglang) implements `Engine` in its own module or package and is named in the registry
(`pipeline.engines.registry`); the orchestration code never branches on an engine's name. Heavy imports (transformers,
vllm, sglang) happen inside the adapters.
"""
from __future__ import annotations

import abc
from typing import ClassVar, Literal, Sequence

from pipeline.core.cli import UsageError
from pipeline.core.contracts import Capture, EngineInfo, EngineSpec, Generation, GenerationRequest, PreparedSample
from pipeline.engines.options import EngineOptions
from pipeline.points import Point


# What an engine is started for: capturing hidden states (extract, diff) or generating answers (regenerate). An adapter
# may start other machinery for each (SGLang: its model runner to capture, its scheduler to generate).
Task = Literal["capture", "generate"]
TASKS = ("capture", "generate")


class GenerationUnsupported(UsageError, NotImplementedError):
    """This engine cannot generate (or not here); the message says why."""


class EngineStartError(UsageError, RuntimeError):
    """The primary engine did not start, so nothing was written. Locally the chained exception holds the engine's
    traceback; on Ray, the actor's log does."""

    nothing_written = True


def error_summary(e: BaseException) -> str:
    """What went wrong in one line: an engine worker's error without its traceback, else `Type: message`."""
    summary = getattr(e, "summary", None) or f"{type(e).__name__}: {e}"
    return " ".join(summary.split())


def first_line(e: BaseException) -> str:
    """The error's first non-blank line (`Type: message`, or an engine worker's summary): what a report names, where
    the whole message can be a traceback from another process."""
    summary = getattr(e, "summary", None) or f"{type(e).__name__}: {e}"
    return next((line.strip() for line in summary.splitlines() if line.strip()), type(e).__name__)


class Engine(abc.ABC):
    """One loaded model in one framework. Use as a context manager: `with engine: engine.capture(...)`."""

    name: ClassVar[str]
    # The virtualenv (relative to the repository root) this adapter must run in, or None for the pipeline's own.
    # vLLM and SGLang pin their own torch builds; `make_engine` runs such adapters in a worker process there.
    environment: ClassVar[str | None] = None
    # The engine's options (`pipeline.engines.options`); the registry names the same class for the driver's check.
    # None: this object does not read them (RemoteEngine: the adapter in its worker parses them).
    options_type: ClassVar[type[EngineOptions] | None] = EngineOptions

    def __init__(self, spec: EngineSpec, *, model_path: str, points: Sequence[Point], num_layers: int,
                 trust_remote_code: bool = False, max_seq_len: int | None = None, task: Task = "capture") -> None:
        if task not in TASKS:
            raise ValueError(f"engine task={task!r}: must be one of {TASKS}")
        self.spec = spec
        self.task: Task = task
        self.model_path = model_path
        # model.trust_remote_code: whether the checkpoint's own Python files (auto_map) may run where it is loaded.
        self.trust_remote_code = bool(trust_remote_code)
        self.dtype = str(spec.dtype)
        self.options = dict(spec.options)
        self.opts = self.options_type.parse(self.options, engine=spec.name) if self.options_type else None
        self.points = list(points)
        self.num_layers = num_layers
        # The longest sequence (tokens) the run will send, when the caller knows it: an adapter may size its context
        # and caches from it (vLLM does) instead of from the checkpoint's far longer context.
        self.max_seq_len = max_seq_len

    @abc.abstractmethod
    def start(self) -> None:
        """Load the model (slow; once per run)."""

    @abc.abstractmethod
    def capture(self, samples: Sequence[PreparedSample]) -> list[Capture]:
        """Run one forward pass over the batch; one Capture per sample, in input order."""

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Continue each request's prompt ids (the engine batches them as it schedules); one Generation per request,
        in request order. Only on an engine made with task="generate"."""
        raise GenerationUnsupported(f"engine={self.spec.name!r} cannot generate")

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
