"""What the drafter was trained on and what it will be served with: the target's facts and the captured features.

From `--run` (the run's manifest: provenance, points, engine), `--export` (the export's sidecar `export.json`: the
slots the trainer read, and the run behind it when its manifest is still there) or `--target` (config.json; a
Kimi-K2.5 wrapper's `text_config` holds the text model). Several may be given: the run or export says what the features
are, the target directory fills in what provenance does not record (the vocabulary size).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.core.cli import UsageError
from pipeline.core.io import read_json_object
from pipeline.models.info import text_config
from pipeline.points import Point, PointError, parse_point
from pipeline.shards.manifest import ManifestError, read_manifest

EXPORT_SIDECAR = "export.json"  # pipeline.exports.sidecar.SIDECAR (the doctor reads it, it does not import exports)


class TargetError(UsageError, ValueError):
    """A run, export or target directory that cannot be read (named)."""


@dataclass(kw_only=True)
class Features:
    """What the shards hold: canonical points, in the order the trainer saw them (aux slots, then the last one)."""

    aux: list[Point] | None  # the aux slots a trainer read (an export); None: any of the run's boundaries
    last: Point | None  # the last slot a trainer read (an export)
    run_points: list[Point]
    trainer_format: str | None  # the export's layout (speculators | specforge), None for a bare run
    source: str  # where these facts came from, for messages


@dataclass(kw_only=True)
class Target:
    model_type: str | None = None
    architecture: str | None = None
    num_layers: int | None = None
    hidden_size: int | None = None
    vocab_size: int | None = None
    features: Features | None = None
    engine: dict[str, Any] = field(default_factory=dict)  # provenance["engine"] of the capture
    diff: dict[str, Any] | None = None  # provenance["diff"] (the gate's summary)
    sources: list[str] = field(default_factory=list)
    model_dir: Path | None = None  # the target's directory when it is here (vLLM builds a draft only over its config)


def _json(path: Path, what: str) -> dict[str, Any]:
    return read_json_object(path, TargetError, prefix=f"{what}: ")


def _points(labels, num_layers: int, where: str) -> list[Point]:
    try:
        return [parse_point(label, num_layers=num_layers) for label in labels]
    except PointError as exc:
        raise TargetError(f"{where}: {exc}") from None


def from_model_dir(target: Target, model_dir: Path) -> None:
    config = _json(Path(model_dir) / "config.json", "--target")
    text = text_config(config)
    archs = config.get("architectures") or [None]
    target.model_type = target.model_type or config.get("model_type")
    target.architecture = target.architecture or archs[0]
    target.num_layers = target.num_layers or text.get("num_hidden_layers")
    target.hidden_size = target.hidden_size or text.get("hidden_size")
    target.vocab_size = target.vocab_size or text.get("vocab_size") or config.get("vocab_size")
    target.model_dir = Path(model_dir)
    target.sources.append(f"target {model_dir}")


def from_run(target: Target, run_dir: Path, *, features: bool = True) -> None:
    try:
        manifest = read_manifest(Path(run_dir))
    except ManifestError as exc:
        raise TargetError(f"--run: {exc}") from None
    prov = manifest.get("provenance") or {}
    model = prov.get("model") or {}
    target.model_type = model.get("model_type")
    target.architecture = model.get("architecture")
    target.num_layers = model.get("num_layers")
    target.hidden_size = manifest.get("hidden_size") or model.get("hidden_size")
    target.engine = prov.get("engine") or {}
    target.diff = prov.get("diff")
    target.sources.append(f"run {run_dir}")
    if features:
        target.features = Features(aux=None, last=None, trainer_format=None, source=f"run {run_dir}",
                                   run_points=_points(manifest["points"], target.num_layers, f"{run_dir} manifest"))
    model_path = model.get("path")
    if model_path and (Path(model_path) / "config.json").is_file():  # the vocabulary is not in provenance
        target.vocab_size = text_config(_json(Path(model_path) / "config.json", "run model")).get("vocab_size")
        target.model_dir = Path(model_path)


def from_export(target: Target, export_dir: Path) -> None:
    sidecar = _json(Path(export_dir) / EXPORT_SIDECAR, "--export (an export is complete once export.json is written)")
    model = sidecar.get("model") or {}
    run_dir = sidecar.get("run_dir")
    if run_dir and Path(run_dir, "manifest.json").is_file():
        from_run(target, Path(run_dir), features=False)
    target.model_type = target.model_type or model.get("model_type")
    target.num_layers = target.num_layers or model.get("num_layers")
    target.hidden_size = target.hidden_size or sidecar.get("hidden_size")
    if target.num_layers is None:
        raise TargetError(f"--export: {export_dir / EXPORT_SIDECAR} names no model.num_layers")
    where = f"{export_dir / EXPORT_SIDECAR}"
    slots = sidecar.get("slots") or []
    aux = _points([s["point"] for s in slots if s.get("role") == "aux"], target.num_layers, where)
    last = _points([s["point"] for s in slots if s.get("role") == "last"], target.num_layers, where)
    target.features = Features(aux=aux, last=last[0] if last else None, trainer_format=sidecar.get("format"),
                               run_points=_points(sidecar.get("run_points") or [], target.num_layers, where),
                               source=f"export {export_dir} ({sidecar.get('format')})")
    target.sources.append(f"export {export_dir}")


def gather(*, run: Path | None, export: Path | None, model_dir: Path | None) -> Target:
    target = Target()
    if export is not None:
        from_export(target, export)
    elif run is not None:
        from_run(target, run)
    if model_dir is not None:
        from_model_dir(target, model_dir)
    return target
