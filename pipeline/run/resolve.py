"""Check a config against the world before any model loads: engine, model, points, data, output directory.

Each failure names the config field and the value. The result is everything later stages need, resolved once. The
checks extract shares with the diff are `pipeline.compare.preflight`'s; the capture points are extract's own.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pipeline.compare.preflight import Lineup, check_engines, preflight
from pipeline.config import ConfigError, ExtractConfig
from pipeline.config.checks import check_points_named
from pipeline.config.location import checked_locations
from pipeline.core.storage import SCHEME
from pipeline.core.store_dir import checked_spool
from pipeline.models.info import ModelInfo
from pipeline.points import Point, PointError, resolve
from pipeline.shards.directory import RUN_DIR
from pipeline.shards.signing_keys import AttestationKeyError, load_signing_key


@dataclass(frozen=True, kw_only=True)
class ResolvedRun:
    cfg: ExtractConfig
    model: ModelInfo
    points: list[Point]
    data_path: Path  # the data file or regeneration read (for data on object storage, its local copy)
    data_url: str | None = None  # data.path on object storage (s3://...); None: data_path is data.path
    out_dir: Path  # where the job writes: the run directory, or for a run on object storage its local spool
    out_url: str | None = None  # the run on object storage (s3://bucket/prefix); None: out_dir is the run
    sign_key: Ed25519PrivateKey | None = None  # sign_key, loaded: it signs the run's attestation

    @property
    def data_name(self) -> str:
        """data.path as the user gave it, for messages."""
        return self.data_url or str(self.data_path)


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
    check_engines(lineup)  # a misspelled engine option is refused before data is copied from object storage
    data_url = cfg.data.path if SCHEME.match(cfg.data.path) else None
    cfg = checked_locations(cfg, RUN_DIR, overwrite=cfg.overwrite)  # before the model is hashed
    checked = preflight(model=cfg.model, data=cfg.data, out_dir=cfg.out_dir, lineup=lineup, run=True,
                        overwrite=cfg.overwrite)
    model = checked.model
    check_points_named(list(cfg.capture.points), "capture.points", model)
    try:
        points = resolve(cfg.capture.points, convention=cfg.capture.convention, family=model.family,
                         num_layers=model.num_layers)
    except PointError as e:
        raise ConfigError(f"capture.points={list(cfg.capture.points)!r} ({cfg.capture.convention} ids): {e}") from e
    url = cfg.out_dir if SCHEME.match(cfg.out_dir) else None
    out_dir = checked.out_dir if url is None else checked_spool(cfg.spool_dir, url, cfg.s3_endpoint)
    return ResolvedRun(cfg=cfg, model=model, points=points, data_path=Path(cfg.data.path), data_url=data_url,
                       out_dir=out_dir, out_url=url, sign_key=sign_key)
