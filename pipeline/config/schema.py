"""Typed configuration: one dataclass per plug point, and one per job (ExtractConfig, DiffJobConfig) that
`pipeline.config.compose` registers in Hydra's ConfigStore as the schema of conf/'s primary configs.

Field-level checks live in `__post_init__` (they run when OmegaConf turns the composed config into objects) and name
the field and the value. Checks that need the outside world (model files, data files, the output directory) live in
`pipeline.config.checks` and `pipeline.compare.preflight`, which every job runs before any model loads.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Optional

from omegaconf import MISSING

from pipeline.config.entries import SpecError, parse_entries, parse_entry
from pipeline.core.contracts import Dtype, EngineSpec
from pipeline.points import FRAMEWORKS

# Choices are enums; fields hold their values as plain strings so that a bad value is a ConfigError naming the field
# (exit status 2) at validation, like every other check, rather than a Hydra composition error.
StorageDtype = StrEnum("StorageDtype", {"float8_e4m3fn": "float8_e4m3fn"})
LengthPolicy = StrEnum("LengthPolicy", {v: v for v in ("truncate", "reject")})
GateMode = StrEnum("GateMode", {v: v for v in ("stop", "warn", "off")})
GateHtml = StrEnum("GateHtml", {v: v for v in ("on_failure", "always", "never")})
AlignmentPolicy = StrEnum("AlignmentPolicy", {v: v for v in ("fail", "warn")})
RunnerName = StrEnum("RunnerName", {v: v for v in ("local", "ray")})
Convention = StrEnum("Convention", {v: v for v in FRAMEWORKS})
COMPUTE_DTYPES = tuple(str(d) for d in Dtype if d != Dtype.auto)


def _require(ok: bool, field_name: str, value: Any, why: str) -> None:
    if not ok:
        raise ValueError(f"{field_name}={value!r}: {why}")


def _choice(choices: type[StrEnum], value: Any, field_name: str) -> StrEnum:
    _require(value in tuple(choices), field_name, value, f"must be one of {tuple(str(c) for c in choices)}")
    return choices(value)


@dataclass(kw_only=True)
class ModelConfig:
    """The target checkpoint (`model=` chooses a group in conf/model/; `model.path=DIR` alone is `model=local`)."""

    name: str = MISSING  # the model's name in provenance and reports (each model group sets it; model=local: local)
    path: Optional[str] = None  # a local checkpoint directory
    build: Optional[str] = None  # a tiny-model recipe (pipeline.factory): the job builds `path` when it is missing
    points: list[Any] = field(default_factory=list)  # the capture points recommended for this target
    # Run the Python files the checkpoint ships (auto_map: Kimi's tokenizer). Off unless asked for: they run with this
    # process's rights. Provenance records the setting and each file's sha256.
    trust_remote_code: bool = False
    # The sampling the model's authors publish (temperature, top_p, top_k, max_tokens): what regeneration samples with
    # where sampling.* is left unset (pipeline/config/regen_schema.py).
    sampling: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _require(self.path is not None or self.build is not None, "model.path", self.path,
                 "a model checkpoint directory is required (pass model.path=/path/to/checkpoint)")


@dataclass(kw_only=True)
class DataConfig:
    """The conversations: JSONL, JSON or Parquet (compressed or not), or a regeneration directory."""

    path: str = MISSING  # JSONL or Parquet of conversations
    max_length: int = 2048  # tokens per sample, at most
    length_policy: str = "truncate"  # a longer sample: truncate (counted in the manifest's num_truncated) | reject
    limit: Optional[int] = None  # first N records only
    # Loss mask (pipeline/data/mask.py): an EAGLE-3 drafter learns what the target generates, so neither is trained
    # by default.
    train_default_system: bool = False  # also train the system turn a template injects (the same in every sample)
    # also train the <think> that opens every assistant body and the empty <think></think> of past turns (prompt
    # tokens when serving: a drafter never proposes them)
    train_think_tags: bool = False

    def __post_init__(self) -> None:
        _require(self.max_length >= 2, "data.max_length", self.max_length, "must be >= 2")
        self.length_policy = _choice(LengthPolicy, self.length_policy, "data.length_policy")
        _require(self.limit is None or self.limit >= 1, "data.limit", self.limit, "must be >= 1 or null")


def check_storage_dtype(value: Optional[str], field_name: str) -> None:
    _require(value is None or value in tuple(StorageDtype), field_name, value,
             f"must be null or one of {tuple(str(d) for d in StorageDtype)}")


@dataclass(kw_only=True)
class RunnerConfig:
    """How the units of work are run (`runner=local|ray`) and what a shard holds."""

    name: str = "local"  # local (this process) | ray (one actor per engine replica)
    max_tokens_per_shard: int = 65536  # bounds the writer's memory: one shard is held at a time (two if overlapped)
    max_samples_per_shard: int = 1024  # a shard (and a unit of work) holds at most this many samples
    storage_dtype: Optional[str] = None  # float8_e4m3fn (a scale per token and point) | null: as captured
    # Write shard k while the engine captures unit k+1. Pays off when the engine computes on GPUs; an engine computing
    # on the same CPU cores loses more to the contention than the write costs (bench/vllm_throughput.py).
    overlap_writes: bool = False
    address: Optional[str] = None  # ray only: the cluster to join; null starts a local one on 127.0.0.1
    num_replicas: int = 1  # engine replicas (ray: one actor each; local: must be 1)
    cpus_per_replica: float = 1.0  # ray only: CPUs Ray reserves per replica (the engine computes with the driver's)
    gpus_per_replica: float = 0.0  # ray only: GPUs per replica (engine.tp_size on GPU clusters)
    max_retries: int = 2  # per unit, after an actor died (engine crash, OOM, kill); then the run fails

    def __post_init__(self) -> None:
        self.name = _choice(RunnerName, self.name, "runner.name")
        _require(self.max_tokens_per_shard >= 1, "runner.max_tokens_per_shard", self.max_tokens_per_shard,
                 "must be >= 1")
        _require(self.max_samples_per_shard >= 1, "runner.max_samples_per_shard", self.max_samples_per_shard,
                 "must be >= 1")
        check_storage_dtype(self.storage_dtype, "runner.storage_dtype")
        _require(self.num_replicas >= 1, "runner.num_replicas", self.num_replicas, "must be >= 1")
        _require(self.max_retries >= 0, "runner.max_retries", self.max_retries, "must be >= 0")
        _require(self.cpus_per_replica >= 0 and self.gpus_per_replica >= 0, "runner.cpus_per_replica",
                 (self.cpus_per_replica, self.gpus_per_replica), "resources must be >= 0")


@dataclass(kw_only=True)
class CaptureConfig:
    """Which hidden states every sample keeps, and the numbering they are written in."""

    # what to capture (default: model.points), e.g. [embed,3,31,59,final_norm], in `convention`'s numbering
    points: list[Any] = field(default_factory=list)
    convention: str = "canonical"  # or a framework whose native ids `points` are written in

    def __post_init__(self) -> None:
        self.convention = _choice(Convention, self.convention, "capture.convention")


@dataclass(kw_only=True)
class ProbeConfig:
    """The probe set: the first prepared samples of the data, truncated, run through every engine."""

    num_samples: int = 4  # the first N prepared samples of the data
    max_tokens: int = 256  # per sample (the probe's prefix of each conversation)
    repeats: int = 2  # captures of the same batch; 2 or more measures run-to-run determinism
    alone: int = 2  # probe samples also captured alone (batch-composition dependence); 0 = off


@dataclass(kw_only=True)
class Thresholds:
    """Tolerances for one compute dtype (a pair is judged by its less precise engine's dtype)."""

    rel_l2: float  # per point: aggregate relative L2 and the 90th percentile of per-token relative L2, at most
    # added to rel_l2 per decoder layer before the point (bk: k layers; final_norm: all of them): rounding noise
    # accumulates with depth, so a deep point of a trained model sits above a shallow one's noise
    rel_l2_per_layer: float = 0.0
    cosine: float  # per point: mean per-token cosine similarity, at least
    top1: float  # logits: top-1 agreement, at least
    kl: float  # logits: mean KL(reference || engine) in nats, at most
    max_abs: Optional[float] = None  # per point: max abs difference, at most (scale-dependent: null = not judged)


def _default_thresholds() -> dict[str, Thresholds]:
    # Each dtype's limits sit above what its rounding alone gives. bfloat16's depth term comes from the trained model
    # (docs/explanation/real-model.md): HF bf16 against HF float32 on SmolLM2, the p90 of per-token relative L2 grows
    # from 6e-3 at b1 to 2.4e-2 at b29 and 3.5e-2 after the last layer (limit there: 1.5e-2 + 30 x 1e-3 = 4.5e-2),
    # while a one-layer shift is >= 0.23 per token at every depth; a flat 1.5e-2, set on the tiny random models
    # (bench/README.md#figures-measured-outside-the-bench-scripts), stopped the trained model's run for plain bf16
    # noise from b15 on. float16 has no depth term: no trained-model evidence for it yet. On MoE models bf16 rounding
    # also flips expert choices; that divergence is judged by `routing_flips`, not by these limits.
    return {
        "float32": Thresholds(rel_l2=1e-4, cosine=0.99999, top1=0.999, kl=1e-4),
        "float16": Thresholds(rel_l2=5e-3, cosine=0.9999, top1=0.98, kl=2e-3),
        "bfloat16": Thresholds(rel_l2=1.5e-2, rel_l2_per_layer=1e-3, cosine=0.999, top1=0.95, kl=1e-2),
    }


@dataclass(kw_only=True)
class RoutingFlipConfig:
    """When divergence is explained by MoE expert-selection flips rather than by a bug.

    At the first divergent point (the onset), which must follow an MoE layer: some tokens, but at most `max_fraction`
    of them, off by more than `token_level` while the median token is still within `bulk_factor` x the dtype's
    rel_l2. Then the onset and everything downstream of it (points, logits) are reported as routing-flip divergence
    (a warning): bf16 rounding changes near-tied expert choices, and the changed tokens spread through attention.
    """

    enabled: bool = True  # false: every divergence is judged by the thresholds alone
    token_level: float = 0.1  # a token's relative L2 above this is a flipped token
    max_fraction: float = 0.25  # at most this share of tokens flipped at the onset
    bulk_factor: float = 2.0  # the median token within this many times the dtype's rel_l2


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
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    thresholds: dict[str, Thresholds] = field(default_factory=_default_thresholds)  # per compute dtype
    routing_flips: RoutingFlipConfig = field(default_factory=RoutingFlipConfig)
    alignment: AlignmentConfig = field(default_factory=AlignmentConfig)
    logits: bool = True  # top-1 / KL through the checkpoint's final norm and LM head
    html: bool = True  # python -m pipeline.diff: report.html with plots (matplotlib)

    def __post_init__(self) -> None:
        try:
            parse_entries(self.engines, "diff.engines")
            parse_entry(self.reference, "diff.reference")
        except SpecError as e:
            raise ValueError(str(e)) from e
        _require(self.points in ("all", "capture") or isinstance(self.points, (list, tuple)), "diff.points",
                 self.points, "must be all, capture, or a list of capture points")
        _check_probe("diff.probe", self.probe)
        for dtype, t in self.thresholds.items():
            _require(dtype in COMPUTE_DTYPES, "diff.thresholds", dtype,
                     f"keys are compute dtypes: {list(COMPUTE_DTYPES)}")
            _require(t.rel_l2 >= 0, f"diff.thresholds.{dtype}.rel_l2", t.rel_l2, "must be >= 0")
            _require(t.rel_l2_per_layer >= 0, f"diff.thresholds.{dtype}.rel_l2_per_layer", t.rel_l2_per_layer,
                     "must be >= 0")
            _require(0 <= t.top1 <= 1, f"diff.thresholds.{dtype}.top1", t.top1, "must be within [0, 1]")
            _require(-1 <= t.cosine <= 1, f"diff.thresholds.{dtype}.cosine", t.cosine, "must be within [-1, 1]")
            _require(t.kl >= 0, f"diff.thresholds.{dtype}.kl", t.kl, "must be >= 0")
        a = self.alignment
        _require(a.margin >= 1, "diff.alignment.margin", a.margin, "must be >= 1")
        _require(a.max_distance > 0, "diff.alignment.max_distance", a.max_distance, "must be > 0")
        a.ambiguous = _choice(AlignmentPolicy, a.ambiguous, "diff.alignment.ambiguous")
        r = self.routing_flips
        _require(0 <= r.max_fraction <= 1, "diff.routing_flips.max_fraction", r.max_fraction, "must be within [0, 1]")


def _check_probe(name: str, probe: ProbeConfig) -> None:
    _require(probe.num_samples >= 1, f"{name}.num_samples", probe.num_samples, "must be >= 1")
    _require(probe.max_tokens >= 2, f"{name}.max_tokens", probe.max_tokens, "must be >= 2")
    _require(probe.repeats >= 1, f"{name}.repeats", probe.repeats, "must be >= 1")
    _require(0 <= probe.alone <= probe.num_samples, f"{name}.alone", probe.alone,
             f"must be between 0 and {name}.num_samples")


@dataclass(kw_only=True)
class GateConfig:
    """The diff as the gate of `python -m pipeline.extract` (pipeline/run/gate.py): before any shard is written, the
    primary engine against `diff.reference` (and `engines`) on a small probe, judged by diff's thresholds."""

    mode: str = "stop"  # stop | warn | off
    engines: list[Any] = field(default_factory=list)  # more engines compared with the primary
    probe: ProbeConfig = field(default_factory=lambda: ProbeConfig(num_samples=4, max_tokens=64, repeats=1, alone=1))
    html: str = "on_failure"  # the gate's report.html: on_failure | always (after the run) | never

    def __post_init__(self) -> None:
        self.mode = _choice(GateMode, self.mode, "gate.mode")
        self.html = _choice(GateHtml, self.html, "gate.html")
        try:
            parse_entries(self.engines, "gate.engines")
        except SpecError as e:
            raise ValueError(str(e)) from e
        _check_probe("gate.probe", self.probe)


@dataclass(kw_only=True)
class ExtractConfig:
    model: ModelConfig = MISSING
    engine: EngineSpec = MISSING
    data: DataConfig = MISSING
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    capture: CaptureConfig = field(default_factory=CaptureConfig)
    gate: GateConfig = field(default_factory=GateConfig)
    # the gate's comparison (reference, thresholds, alignment, routing flips); diff.engines/probe/html: unused here
    diff: DiffConfig = field(default_factory=DiffConfig)
    out_dir: str = MISSING  # the run directory (default runs/<date>-<time>), or s3://bucket/prefix
    s3_endpoint: Optional[str] = None  # object storage's endpoint (null: AWS_ENDPOINT_URL, else AWS's)
    # out_dir on object storage: where each unit is written before it is uploaded (a folder per out_dir, holding only
    # the units in flight); data.path there: where it is copied to be read
    spool_dir: str = "~/.cache/pipeline/spool"
    overwrite: bool = False  # replace a finished run directory (never done silently)
    wait_for_lock: bool = False  # another extract holds out_dir: wait for it to finish instead of exiting
    sign_key: Optional[str] = None  # an Ed25519 private key (PEM) that signs the run's attestation; null: unsigned
    plan: bool = False  # print the run's plan (tokens, bytes, free space, engines and memory per GPU), start nothing
    check_space: bool = True  # refuse, before any engine starts, a job out_dir (or the spool) cannot hold


@dataclass(kw_only=True)
class DiffJobConfig:
    """`python -m pipeline.diff` (conf/diff.yaml): what the diff job reads and nothing else, so that an extract-only key
    (`runner.num_replicas`, `overwrite`, `engine.dtype`) is refused by name instead of ignored."""

    model: ModelConfig = MISSING
    data: DataConfig = MISSING
    diff: DiffConfig = field(default_factory=DiffConfig)
    # diff.points=capture compares at capture.points; a list is in capture.convention, as extract reads them
    capture: CaptureConfig = field(default_factory=CaptureConfig)
    storage_dtype: Optional[str] = None  # also report what storing the compared states in this dtype costs
    out_dir: str = MISSING  # where report.json, report.md and report.html are written
    s3_endpoint: Optional[str] = None  # data.path on object storage: its endpoint (null: AWS_ENDPOINT_URL, else AWS's)
    spool_dir: str = "~/.cache/pipeline/spool"  # data.path on object storage: where it is copied to be read

    def __post_init__(self) -> None:
        check_storage_dtype(self.storage_dtype, "storage_dtype")
