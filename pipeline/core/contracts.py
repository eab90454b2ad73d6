"""The plain contracts every layer shares: what a sample is, what an engine is asked for and what it returns.

Nothing here computes; these are the shapes that cross from data preparation to engines to shards to the diff. They
import no other part of the pipeline.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np
import torch


class Dtype(StrEnum):
    """An engine's compute dtype; `auto` is the checkpoint's own."""

    auto = "auto"
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


@dataclass(frozen=True, kw_only=True)
class PreparedSample:
    """One tokenized conversation, ready for capture.

    input_ids_T: token ids (int64, shape [T]) exactly as the chat template produced them (after the length policy).
    loss_mask_T: 1 on tokens the drafter is trained to predict (assistant turns), else 0 (uint8, shape [T]).
    """

    sample_id: str  # stable: digest of source identity and row
    source: str  # the data file name the record came from
    row: int  # 0-based record index within the source
    input_ids_T: np.ndarray
    loss_mask_T: np.ndarray
    truncated: bool = False

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids_T.shape[0])

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask_T.sum())


@dataclass(frozen=True, kw_only=True)
class Reject:
    """A record (or a captured sample) that was not written, and why."""

    source: str
    row: int
    reason: str  # a short machine-readable code, e.g. "empty", "malformed_json", "too_long"
    detail: str  # a human-readable explanation with the measured values
    sample_id: str | None = None


@dataclass(kw_only=True)
class EngineSpec:
    """One engine as configured: the `engine:` config group, an entry of `diff.engines`, what an executor replicates
    and what a worker process rebuilds. What it runs on (checkpoint, points) is given when the engine is made."""

    name: str = "???"  # a registered engine (pipeline.engines.registry); "???" = required (OmegaConf's MISSING)
    dtype: str = Dtype.auto  # one of Dtype
    batch_size: int = 8  # samples per engine call
    tp_size: int = 1  # tensor-parallel ranks (GPUs) of one replica
    options: dict[str, Any] = field(default_factory=dict)  # engine-specific: its options class (engines/options.py)

    def __post_init__(self) -> None:
        if self.dtype not in tuple(Dtype):
            raise ValueError(f"engine.dtype={self.dtype!r}: must be one of {tuple(str(d) for d in Dtype)}")
        self.dtype = Dtype(self.dtype)
        for key in ("batch_size", "tp_size"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"engine.{key}={value!r}: must be >= 1")

    def to_dict(self) -> dict[str, Any]:
        """JSON-able, for reports and the worker protocol."""
        return {"name": self.name, "dtype": str(self.dtype), "batch_size": self.batch_size, "tp_size": self.tp_size,
                "options": dict(self.options)}


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


@dataclass(frozen=True, kw_only=True)
class Sampling:
    """How one generation request samples, as the regeneration stage asks for it (pipeline/regen/sampling.py);
    what the engine really applied comes back in `Generation.applied`."""

    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k cut
    max_tokens: int = 1024  # generated tokens at most; a turn stopped here is truncated (finish_reason "length")
    seed: int | None = None  # per request (the stage derives one per record and sample from the configured seed)
    stop_token_ids: tuple[int, ...] = ()  # end-of-turn ids: generation stops after emitting one (kept in the ids)

    def to_dict(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                "max_tokens": self.max_tokens, "seed": self.seed, "stop_token_ids": list(self.stop_token_ids)}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "Sampling":
        return cls(**{**raw, "stop_token_ids": tuple(raw.get("stop_token_ids", ()))})


@dataclass(frozen=True, kw_only=True)
class GenerationRequest:
    """Continue `prompt_ids` (rendered by the model's own chat template, never re-tokenised by the engine)."""

    request_id: str
    prompt_ids: tuple[int, ...]
    sampling: Sampling

    def to_dict(self) -> dict[str, Any]:
        return {"request_id": self.request_id, "prompt_ids": list(self.prompt_ids), "sampling": self.sampling.to_dict()}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "GenerationRequest":
        return cls(request_id=raw["request_id"], prompt_ids=tuple(raw["prompt_ids"]),
                   sampling=Sampling.from_dict(raw["sampling"]))


@dataclass(frozen=True, kw_only=True)
class Generation:
    """What the engine generated for one request: the ids exactly as produced (a stop id it emitted included), why it
    stopped ("stop": an end-of-turn id; "length": max_tokens reached) and the sampling values it really applied, its
    own defaults included (read from the engine's sampling objects, not echoed from the request)."""

    request_id: str
    output_ids: tuple[int, ...]
    finish_reason: str
    applied: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"request_id": self.request_id, "output_ids": list(self.output_ids),
                "finish_reason": self.finish_reason, "applied": self.applied}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "Generation":
        return cls(request_id=raw["request_id"], output_ids=tuple(raw["output_ids"]),
                   finish_reason=raw["finish_reason"], applied=dict(raw.get("applied") or {}))


FINISH_REASONS = ("stop", "length")


# EngineInfo.extra's key for the CPU threads an engine's forward ran on, where they change the bits (bf16 CPU kernels);
# also a key of every shard's metadata (pipeline.provenance.compact), so a resume sees what each shard was made with.
CPU_THREADS = "cpu_threads"


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

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "EngineInfo":
        return cls(**{**raw, "points": [PointSource(**p) for p in raw.get("points", [])]})
