"""Typed configuration: one dataclass per plug point, registered in Hydra's ConfigStore as the schema of conf/.

Field-level checks live in `__post_init__` (they run when OmegaConf turns the composed config into objects) and name
the field and the value. Checks that need the outside world (model files, data files, the output directory) live in
`pipeline.run.resolve`, which runs before any model loads.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from pipeline.points import FRAMEWORKS

DTYPES = ("auto", "float32", "bfloat16", "float16")
STORAGE_DTYPES = ("float8_e4m3fn",)
LENGTH_POLICIES = ("truncate", "reject")
GATE_MODES = ("stop", "warn", "off")
GATE_HTML = ("on_failure", "always", "never")
ALIGNMENT_POLICIES = ("fail", "warn")


class ConfigError(ValueError):
    """A configuration that cannot run; raised before any model is loaded, naming the field and the value."""


def _require(ok: bool, field_name: str, value: Any, why: str) -> None:
    if not ok:
        raise ValueError(f"{field_name}={value!r}: {why}")


@dataclass(kw_only=True)
class ModelConfig:
    name: str = MISSING
    path: Optional[str] = None  # a local checkpoint directory
    build: Optional[str] = None  # a tiny-model recipe: `path` is built locally when it is missing
    points: list[Any] = field(default_factory=list)  # the capture points recommended for this target

    def __post_init__(self) -> None:
        _require(self.path is not None or self.build is not None, "model.path", self.path,
                 "a model checkpoint directory is required (pass model.path=/path/to/checkpoint)")


@dataclass(kw_only=True)
class EngineConfig:
    name: str = MISSING
    dtype: str = "auto"  # compute dtype; "auto" = the checkpoint's dtype
    batch_size: int = 8
    tp_size: int = 1
    options: dict[str, Any] = field(default_factory=dict)  # engine-specific, passed to the adapter as is

    def __post_init__(self) -> None:
        _require(self.dtype in DTYPES, "engine.dtype", self.dtype, f"must be one of {DTYPES}")
        _require(self.batch_size >= 1, "engine.batch_size", self.batch_size, "must be >= 1")
        _require(self.tp_size >= 1, "engine.tp_size", self.tp_size, "must be >= 1")


@dataclass(kw_only=True)
class DataConfig:
    path: str = MISSING  # JSONL or Parquet of conversations
    max_length: int = 2048
    length_policy: str = "truncate"
    limit: Optional[int] = None  # first N records only

    def __post_init__(self) -> None:
        _require(self.max_length >= 2, "data.max_length", self.max_length, "must be >= 2")
        _require(self.length_policy in LENGTH_POLICIES, "data.length_policy", self.length_policy,
                 f"must be one of {LENGTH_POLICIES}")
        _require(self.limit is None or self.limit >= 1, "data.limit", self.limit, "must be >= 1 or null")


RUNNERS = ("local", "ray")


@dataclass(kw_only=True)
class RunnerConfig:
    name: str = "local"
    max_tokens_per_shard: int = 65536  # bounds the writer's memory: one shard is held at a time (two if overlapped)
    max_samples_per_shard: int = 1024
    storage_dtype: Optional[str] = None  # None = the engine's compute dtype
    # Write shard k while the engine captures unit k+1. Pays off when the engine computes on GPUs; an engine computing
    # on the same CPU cores loses more to the contention than the write costs (bench/vllm_throughput.py).
    overlap_writes: bool = False
    # ray only: the cluster (None = start a local one on 127.0.0.1), replicas and what each one holds
    address: Optional[str] = None
    num_replicas: int = 1
    cpus_per_replica: float = 1.0
    gpus_per_replica: float = 0.0  # a replica = TP GPUs on GPU clusters
    max_retries: int = 2  # per unit, after an actor died (engine crash, OOM, kill); then the run fails

    def __post_init__(self) -> None:
        _require(self.name in RUNNERS, "runner.name", self.name, f"must be one of {RUNNERS}")
        _require(self.max_tokens_per_shard >= 1, "runner.max_tokens_per_shard", self.max_tokens_per_shard,
                 "must be >= 1")
        _require(self.max_samples_per_shard >= 1, "runner.max_samples_per_shard", self.max_samples_per_shard,
                 "must be >= 1")
        _require(self.storage_dtype is None or self.storage_dtype in STORAGE_DTYPES, "runner.storage_dtype",
                 self.storage_dtype, f"must be null or one of {STORAGE_DTYPES}")
        _require(self.num_replicas >= 1, "runner.num_replicas", self.num_replicas, "must be >= 1")
        _require(self.max_retries >= 0, "runner.max_retries", self.max_retries, "must be >= 0")
        _require(self.cpus_per_replica >= 0 and self.gpus_per_replica >= 0, "runner.cpus_per_replica",
                 (self.cpus_per_replica, self.gpus_per_replica), "resources must be >= 0")


@dataclass(kw_only=True)
class CaptureConfig:
    points: list[Any] = field(default_factory=list)
    convention: str = "canonical"  # or a framework whose native ids `points` are written in

    def __post_init__(self) -> None:
        _require(self.convention in FRAMEWORKS, "capture.convention", self.convention,
                 f"must be one of {FRAMEWORKS}")


@dataclass(kw_only=True)
class ProbeConfig:
    """The probe set: the first prepared samples of the data, truncated, run through every engine."""

    num_samples: int = 4
    max_tokens: int = 256  # per sample (the probe's prefix of each conversation)
    repeats: int = 2  # captures of the same batch; 2 or more measures run-to-run determinism
    alone: int = 2  # probe samples also captured alone (batch-composition dependence); 0 = off


@dataclass(kw_only=True)
class Thresholds:
    """Tolerances for one compute dtype (a pair is judged by its less precise engine's dtype)."""

    rel_l2: float  # per point: aggregate relative L2 and the 90th percentile of per-token relative L2, at most
    cosine: float  # per point: mean per-token cosine similarity, at least
    top1: float  # logits: top-1 agreement, at least
    kl: float  # logits: mean KL(reference || engine) in nats, at most
    max_abs: Optional[float] = None  # per point: max abs difference, at most (scale-dependent: null = not judged)


def _default_thresholds() -> dict[str, Thresholds]:
    # Measured on the tiny models (bundled conversations, 4 x 256 tokens), HF against HF float32:
    # bf16 Llama: rel L2 4e-3 at b1 .. 1.1e-2 at the last point, top-1 98.6%, KL 7e-4;
    # bf16 Kimi: 5e-3 at b1, then MoE routing flips (judged by `routing_flips`, not by these limits).
    return {
        "float32": Thresholds(rel_l2=1e-4, cosine=0.99999, top1=0.999, kl=1e-4),
        "float16": Thresholds(rel_l2=5e-3, cosine=0.9999, top1=0.98, kl=2e-3),
        "bfloat16": Thresholds(rel_l2=1.5e-2, cosine=0.999, top1=0.95, kl=1e-2),
    }


@dataclass(kw_only=True)
class RoutingFlipConfig:
    """When divergence is explained by MoE expert-selection flips rather than by a bug.

    At the first divergent point (the onset), which must follow an MoE layer: some tokens, but at most `max_fraction`
    of them, off by more than `token_level` while the median token is still within `bulk_factor` x the dtype's
    rel_l2. Then the onset and everything downstream of it (points, logits) are reported as routing-flip divergence
    (a warning): bf16 rounding changes near-tied expert choices, and the changed tokens spread through attention.
    """

    enabled: bool = True
    token_level: float = 0.1
    max_fraction: float = 0.25
    bulk_factor: float = 2.0


@dataclass(kw_only=True)
class AlignmentConfig:
    """Which reference point each captured point matches (median per-token relative L2 as the distance)."""

    margin: float = 2.0  # the claimed point must be at least this many times closer than any other
    max_distance: float = 0.5  # farther than this from every reference point: the point matches nothing
    ambiguous: str = "fail"  # a point that cannot be told from its neighbours at this noise level: fail | warn


@dataclass(kw_only=True)
class DiffConfig:
    """`python -m pipeline.diff` (engines vs reference) and the gate of `python -m pipeline.extract`."""

    engines: list[Any] = field(default_factory=lambda: ["hf@bfloat16"])  # name, name@dtype or {name: ..., ...}
    reference: Any = "hf@float32"  # captures every boundary + final_norm (the alignment matrix needs them all)
    points: Any = "all"  # what the compared engines capture: all | capture (= capture.points) | a list
    gate: str = "stop"  # extract: stop | warn | off
    gate_engines: list[Any] = field(default_factory=list)  # extract: more engines compared with the primary
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    gate_probe: ProbeConfig = field(
        default_factory=lambda: ProbeConfig(num_samples=4, max_tokens=64, repeats=1, alone=1))
    thresholds: dict[str, Thresholds] = field(default_factory=_default_thresholds)
    routing_flips: RoutingFlipConfig = field(default_factory=RoutingFlipConfig)
    alignment: AlignmentConfig = field(default_factory=AlignmentConfig)
    logits: bool = True  # top-1 / KL through the checkpoint's final norm and LM head
    html: bool = True  # python -m pipeline.diff: report.html with plots (matplotlib)
    gate_html: str = "on_failure"  # extract: the gate's report.html: on_failure | always (after the run) | never

    def __post_init__(self) -> None:
        from pipeline.compare.spec import SpecError, parse_spec, parse_specs

        _require(self.gate in GATE_MODES, "diff.gate", self.gate, f"must be one of {GATE_MODES}")
        _require(self.gate_html in GATE_HTML, "diff.gate_html", self.gate_html, f"must be one of {GATE_HTML}")
        try:
            parse_specs(self.engines, "diff.engines")
            parse_specs(self.gate_engines, "diff.gate_engines")
            parse_spec(self.reference, "diff.reference")
        except SpecError as e:
            raise ValueError(str(e)) from e
        _require(self.points in ("all", "capture") or isinstance(self.points, (list, tuple)), "diff.points",
                 self.points, "must be all, capture, or a list of capture points")
        for name, probe in (("diff.probe", self.probe), ("diff.gate_probe", self.gate_probe)):
            _require(probe.num_samples >= 1, f"{name}.num_samples", probe.num_samples, "must be >= 1")
            _require(probe.max_tokens >= 2, f"{name}.max_tokens", probe.max_tokens, "must be >= 2")
            _require(probe.repeats >= 1, f"{name}.repeats", probe.repeats, "must be >= 1")
            _require(0 <= probe.alone <= probe.num_samples, f"{name}.alone", probe.alone,
                     f"must be between 0 and {name}.num_samples")
        for dtype, t in self.thresholds.items():
            _require(dtype in DTYPES and dtype != "auto", "diff.thresholds", dtype,
                     f"keys are compute dtypes: {[d for d in DTYPES if d != 'auto']}")
            _require(t.rel_l2 >= 0, f"diff.thresholds.{dtype}.rel_l2", t.rel_l2, "must be >= 0")
            _require(0 <= t.top1 <= 1, f"diff.thresholds.{dtype}.top1", t.top1, "must be within [0, 1]")
            _require(-1 <= t.cosine <= 1, f"diff.thresholds.{dtype}.cosine", t.cosine, "must be within [-1, 1]")
            _require(t.kl >= 0, f"diff.thresholds.{dtype}.kl", t.kl, "must be >= 0")
        a = self.alignment
        _require(a.margin >= 1, "diff.alignment.margin", a.margin, "must be >= 1")
        _require(a.max_distance > 0, "diff.alignment.max_distance", a.max_distance, "must be > 0")
        _require(a.ambiguous in ALIGNMENT_POLICIES, "diff.alignment.ambiguous", a.ambiguous,
                 f"must be one of {ALIGNMENT_POLICIES}")
        r = self.routing_flips
        _require(0 <= r.max_fraction <= 1, "diff.routing_flips.max_fraction", r.max_fraction, "must be within [0, 1]")


@dataclass(kw_only=True)
class ExtractConfig:
    model: ModelConfig = MISSING
    engine: EngineConfig = MISSING
    data: DataConfig = MISSING
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    capture: CaptureConfig = field(default_factory=CaptureConfig)
    diff: DiffConfig = field(default_factory=DiffConfig)  # the gate before capture; the engines of pipeline.diff
    out_dir: str = MISSING
    overwrite: bool = False  # replace a finished run directory (never done silently)


def _package_data(relative: str) -> str:
    return str(Path(__file__).resolve().parent / "data" / relative)


def _tiny_model_dir(name: str) -> str:
    from pipeline.models.tiny import default_root

    return str(default_root() / name)


def register_configs() -> None:
    """Schema + resolvers: `${pipeline_data:...}` (files shipped in the package, e.g. the bundled data) and
    `${tiny_model:NAME}` (where the tiny local models are built: $PIPELINE_MODELS_DIR or <repo>/.cache/models)."""
    ConfigStore.instance().store(name="extract_schema", node=ExtractConfig)
    OmegaConf.register_new_resolver("pipeline_data", _package_data, replace=True)
    OmegaConf.register_new_resolver("tiny_model", _tiny_model_dir, replace=True)


def to_config(cfg: DictConfig) -> ExtractConfig:
    """The composed Hydra config as validated objects; a missing required value names its key."""
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(f"required config value(s) missing: {', '.join(missing)} (pass them as overrides, "
                         f"e.g. {missing[0]}=...)")
    try:
        obj = OmegaConf.to_object(cfg)
    except ValueError as e:  # a __post_init__ check, possibly wrapped by OmegaConf with its own context
        raise ConfigError(str(e)) from e
    assert isinstance(obj, ExtractConfig)
    return obj


def resolved_dict(cfg: DictConfig) -> dict[str, Any]:
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
