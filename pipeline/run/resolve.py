"""Check a config against the world before any model loads: engine, model, points, data, output directory.

Each failure names the config field and the value. The result is everything later stages need, resolved once. The
checks extract shares with the diff are `pipeline.compare.preflight`'s; the capture points are extract's own.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pipeline.compare.preflight import Lineup, preflight
from pipeline.config import ConfigError, ExtractConfig
from pipeline.config.checks import check_points_named
from pipeline.models.info import ModelInfo
from pipeline.points import Point, PointError, resolve
from pipeline.shards.attestation import AttestationKeyError, load_signing_key


@dataclass(frozen=True, kw_only=True)
class ResolvedRun:
    cfg: ExtractConfig
    model: ModelInfo
    points: list[Point]
    data_path: Path
    out_dir: Path
    sign_key: Ed25519PrivateKey | None = None  # sign_key, loaded: it signs the run's attestation


def _sign_key(path: str | None) -> Ed25519PrivateKey | None:
    if path is None:
        return None
    try:
        return load_signing_key(path)
    except AttestationKeyError as e:
        raise ConfigError(f"sign_key={path!r}: {e}") from None


def resolve_run(cfg: ExtractConfig) -> ResolvedRun:
    lineup = Lineup(primary=cfg.engine, reference=cfg.diff.reference, others=cfg.gate.engines,
                    where="gate.engines")
    sign_key = _sign_key(cfg.sign_key)  # before anything else reads the world: a bad key is found at once
    checked = preflight(model=cfg.model, data=cfg.data, out_dir=cfg.out_dir, lineup=lineup, run=True,
                        overwrite=cfg.overwrite)
    model = checked.model
    check_points_named(list(cfg.capture.points), "capture.points", model)
    try:
        points = resolve(cfg.capture.points, convention=cfg.capture.convention, family=model.family,
                         num_layers=model.num_layers)
    except PointError as e:
        raise ConfigError(f"capture.points={list(cfg.capture.points)!r} ({cfg.capture.convention} ids): {e}") from e
    return ResolvedRun(cfg=cfg, model=model, points=points, data_path=Path(cfg.data.path), out_dir=checked.out_dir,
                       sign_key=sign_key)
