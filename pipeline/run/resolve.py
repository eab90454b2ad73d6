"""Check a config against the world before any model loads: engine, model, points, data, output directory.

Each failure names the config field and the value. The result is everything later stages need, resolved once. The
checks extract shares with the diff are `pipeline.compare.preflight`'s; the capture points are extract's own.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pipeline.compare.preflight import Lineup, preflight
from pipeline.config import ConfigError, ExtractConfig
from pipeline.config.checks import check_points_named
from pipeline.core.outdir import unusable_dir
from pipeline.core.storage import SCHEME
from pipeline.core.store_dir import opened, spool_for
from pipeline.models.info import ModelInfo
from pipeline.points import Point, PointError, resolve
from pipeline.shards.attestation import AttestationKeyError, load_signing_key


@dataclass(frozen=True, kw_only=True)
class ResolvedRun:
    cfg: ExtractConfig
    model: ModelInfo
    points: list[Point]
    data_path: Path
    out_dir: Path  # where the job writes: the run directory, or for a run on object storage its local spool
    out_url: str | None = None  # the run on object storage (s3://bucket/prefix); None: out_dir is the run
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
    url = cfg.out_dir if SCHEME.match(cfg.out_dir) else None
    out_dir = checked.out_dir if url is None else _spool(cfg, url)
    return ResolvedRun(cfg=cfg, model=model, points=points, data_path=Path(cfg.data.path), out_dir=out_dir,
                       out_url=url, sign_key=sign_key)


def _spool(cfg: ExtractConfig, url: str) -> Path:
    """The local folder a run on object storage stages its units in; refused when it cannot be written."""
    if cfg.s3_endpoint and urlsplit(cfg.s3_endpoint).username is not None:  # it is recorded with the run's config
        raise ConfigError("s3_endpoint holds a user name or password: give credentials in AWS_ACCESS_KEY_ID and "
                          "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), never in the endpoint")
    spool = spool_for(cfg.spool_dir, opened(url, cfg.s3_endpoint))  # an unsupported URL is refused here
    if (why := unusable_dir(spool)) is not None:
        raise ConfigError(f"spool_dir={cfg.spool_dir!r} (the local folder units are written in before they are "
                          f"uploaded to {url}) {why}")
    return spool
