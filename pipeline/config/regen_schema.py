"""The regeneration job's config (`python -m pipeline.regenerate`, conf/regenerate.yaml): the groups extract
uses (model, engine, data, runner) and what regeneration adds (sampling, the truncated-turn policy). Its config is
closed like every job's: an extract-only key (`capture.points`, `sign_key`, `gate`, `diff`) is refused by name. One
recipe (`+exp=kimi`) serves both jobs because a model's gate settings are extract's own group
(conf/model_gate/, added by conf/config.yaml only)."""
from __future__ import annotations

import math

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Optional

from omegaconf import MISSING

from pipeline.config.schema import DataConfig, ModelConfig, RunnerConfig, _choice, _require
from pipeline.core.contracts import EngineSpec

TruncatedPolicy = StrEnum("TruncatedPolicy", {v: v for v in ("keep", "drop")})


# Where sampling.* and model.sampling leave a value unset.
SAMPLING_DEFAULTS = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": 512}


@dataclass(kw_only=True)
class SamplingConfig:
    """What every turn is sampled with. A value left null is the model's published one (`model.sampling`, set by its
    model group: conf/model/kimi_k25.yaml), else SAMPLING_DEFAULTS (greedy); `resolved` says which. Each request's
    seed derives from `seed` and the conversation's id; what the engine really applied, its defaults included, is
    recorded per turn and in the manifest."""

    temperature: Optional[float] = None  # 0: greedy
    top_p: Optional[float] = None  # nucleus sampling, (0, 1]; 1: off
    top_k: Optional[int] = None  # 0: off
    max_tokens: Optional[int] = None  # per turn (and at most data.max_length minus the prompt)
    seed: int = 0  # each request's seed derives from it and the conversation's id (never the batch order)
    n: int = 1  # samples per prompt: n conversations per record, each continuing its own answers
    stop_token_ids: Optional[list[int]] = None  # null: generation_config.json's eos, the tokenizer's, <|im_end|>
    # A turn stopped at max_tokens ends its conversation; keep: it is written (its ids end where the engine stopped,
    # with no end-of-turn token it never produced); drop: it is not. Counted either way.
    truncated: str = "keep"

    def __post_init__(self) -> None:
        _require(self.n >= 1, "sampling.n", self.n, "must be >= 1")
        for i in self.stop_token_ids or []:  # token ids: what an engine's int64 ids can hold, never negative
            _require(0 <= i < 1 << 63, "sampling.stop_token_ids", self.stop_token_ids,
                     f"{i} is not a token id (0 <= id < 2**63)")
        self.truncated = _choice(TruncatedPolicy, self.truncated, "sampling.truncated")

    def resolved(self, published: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        """(the values every request samples with, where each came from), checked: errors name the setting."""
        values, origin = {}, {}
        for key, default in SAMPLING_DEFAULTS.items():
            own = getattr(self, key)
            if own is not None:
                values[key], origin[key] = own, f"sampling.{key}"
            elif published.get(key) is not None:
                values[key], origin[key] = published[key], f"model.sampling.{key}"
            else:
                values[key], origin[key] = default, "default"
        unknown = sorted(set(published) - set(SAMPLING_DEFAULTS))
        _require(not unknown, "model.sampling", published, f"unknown keys {unknown}; known: {list(SAMPLING_DEFAULTS)}")
        name = {k: origin[k] if origin[k] != "default" else f"sampling.{k}" for k in origin}
        # finite first: inf passed ">= 0" (random answers, a manifest holding the non-JSON Infinity); nan fails it
        _require(math.isfinite(values["temperature"]) and values["temperature"] >= 0, name["temperature"],
                 values["temperature"], "must be a finite number >= 0")
        _require(math.isfinite(values["top_p"]) and 0 < values["top_p"] <= 1, name["top_p"], values["top_p"],
                 "must be within (0, 1]")
        _require(values["top_k"] >= 0, name["top_k"], values["top_k"], "must be >= 0 (0: off)")
        _require(values["max_tokens"] >= 1, name["max_tokens"], values["max_tokens"], "must be >= 1")
        _require(self.n == 1 or values["temperature"] > 0, "sampling.n", self.n,
                 "n > 1 needs a temperature > 0 (greedy samples are all the same answer)")
        return values, origin


@dataclass(kw_only=True)
class RegenerateConfig:
    model: ModelConfig = MISSING
    engine: EngineSpec = MISSING
    data: DataConfig = MISSING
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    out_dir: str = MISSING  # the regeneration directory (extract reads it as data.path), or s3://bucket/prefix
    # out_dir or data.path on object storage: its endpoint (null: AWS_ENDPOINT_URL, else AWS's)
    s3_endpoint: Optional[str] = None
    # out_dir on object storage: where each unit is written before it is uploaded; data.path there: where it is copied
    spool_dir: str = "~/.cache/pipeline/spool"
    overwrite: bool = False  # replace a finished regeneration (never done silently)
    wait_for_lock: bool = False  # another regenerate holds out_dir: wait for it to finish instead of exiting
    # the parts' bound (every turn's prompt and answer at data.max_length) against out_dir's free space
    # (pipeline/regen/room.py)
    check_space: bool = True  # refuse, before any engine starts, a job out_dir (or the spool) cannot hold
