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
from pipeline.core.jsonfile import MAX_BYTES, Fields, parse, read_fields
from pipeline.core.stores import open_store
from pipeline.models.info import text_config
from pipeline.points import Point, PointError, parse_point
from pipeline.shards.layout import MANIFEST_NAME
from pipeline.shards.manifest import ManifestError
from pipeline.shards.run_at import RunAt

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
    last_unnormed: bool = False  # the last slot is final_norm divided by the final-norm weight (export --last)


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
    answers: dict[str, Any] | None = None  # provenance["data"]["regeneration"]: who wrote the answers
    sources: list[str] = field(default_factory=list)
    model_dir: Path | None = None  # the target's directory when it is here (vLLM builds a draft only over its config)


def _fields(path: Path, what: str) -> Fields:
    return read_fields(path, TargetError, prefix=f"{what}: ")


def _text(config: Fields) -> Fields:
    """The text model's fields (models.info.text_config: a Kimi-K2.5 wrapper nests them)."""
    inner = text_config(config.value)
    return config if inner is config.value else Fields(inner, file=config.file, error=config.error,
                                                       at=config.path("text_config"))


def _points(labels, num_layers: int, where: str) -> list[Point]:
    try:
        return [parse_point(label, num_layers=num_layers) for label in labels]
    except PointError as exc:
        raise TargetError(f"{where}: {exc}") from None


def from_model_dir(target: Target, model_dir: Path) -> None:
    config = _fields(Path(model_dir) / "config.json", "--target")
    text = _text(config)
    archs = config.list("architectures", "str", optional=True) or [None]
    target.model_type = target.model_type or config.str("model_type", optional=True)
    target.architecture = target.architecture or archs[0]
    target.num_layers = target.num_layers or text.int("num_hidden_layers", optional=True, minimum=1)
    target.hidden_size = target.hidden_size or text.int("hidden_size", optional=True, minimum=1)
    target.vocab_size = target.vocab_size or text.int("vocab_size", optional=True, minimum=1) \
        or config.int("vocab_size", optional=True, minimum=1)
    target.model_dir = Path(model_dir)
    target.sources.append(f"target {model_dir}")


def _manifest(run: RunAt) -> Fields:
    try:
        manifest = run.manifest()
    except ManifestError as exc:
        raise TargetError(f"--run: {exc}") from None
    return Fields(manifest, file=f"--run: manifest {run.where(MANIFEST_NAME)}", error=TargetError)


def _none(parent: Fields, key: str) -> Fields:
    """An absent object's (empty) fields: every optional field of it is None."""
    return Fields({}, file=parent.file, error=parent.error, at=parent.path(key))


def _engine(prov: Fields) -> dict[str, Any]:
    """provenance.engine, its quantization record an object (the kernels check reads its kernel)."""
    engine = prov.obj("engine", optional=True)
    if engine is None:
        return {}
    engine.obj("quantization", optional=True)
    return dict(engine.value)


def _diff(prov: Fields) -> dict[str, Any] | None:
    """provenance.diff (the gate's summary), each of its pairs an object."""
    diff = prov.obj("diff", optional=True)
    if diff is None:
        return None
    pairs = diff.obj("pairs", optional=True)
    for name in pairs.value if pairs is not None else ():
        pairs.obj(name)
    return dict(diff.value)


def from_run(target: Target, run_dir: Path | str, *, features: bool = True) -> None:
    """`run_dir`: a run directory, or a run on object storage (an `s3://` URL, a string)."""
    manifest = _manifest(RunAt(run_dir))
    prov = manifest.obj("provenance", optional=True) or _none(manifest, "provenance")
    model = prov.obj("model", optional=True) or _none(prov, "model")
    target.model_type = model.str("model_type", optional=True)
    target.architecture = model.str("architecture", optional=True)
    target.num_layers = model.int("num_layers", optional=True, minimum=1)
    target.hidden_size = manifest.int("hidden_size", optional=True) or model.int("hidden_size", optional=True)
    target.engine, target.diff = _engine(prov), _diff(prov)
    data = prov.obj("data", optional=True)
    regeneration = data.obj("regeneration", optional=True) if data is not None else None
    target.answers = dict(regeneration.value) if regeneration is not None else None
    target.sources.append(f"run {run_dir}")
    if features:
        target.features = Features(aux=None, last=None, trainer_format=None, source=f"run {run_dir}",
                                   run_points=_points(manifest.list("points", "str"), target.num_layers,
                                                      f"{run_dir} manifest"))
    model_path = model.str("path", optional=True)
    if model_path and (Path(model_path) / "config.json").is_file():  # the vocabulary is not in provenance
        target.vocab_size = _text(_fields(Path(model_path) / "config.json", "run model")).int(
            "vocab_size", optional=True, minimum=1)
        target.model_dir = Path(model_path)


def _sidecar(export_dir: Path | str) -> tuple[Fields, str]:
    """The export's export.json, read from its directory or its prefix on a store (`s3://...`), and where it is."""
    what = "--export (an export is complete once export.json is written)"
    if not isinstance(export_dir, str):
        path = Path(export_dir) / EXPORT_SIDECAR
        return _fields(path, what), str(path)
    where = f"{export_dir.rstrip('/')}/{EXPORT_SIDECAR}"
    try:
        data = open_store(export_dir).get(EXPORT_SIDECAR, 0, MAX_BYTES + 1)
    except FileNotFoundError:
        raise TargetError(f"{what}: {where} is missing") from None
    value = parse(data, TargetError, where=f"{what}: {where}")
    if not isinstance(value, dict):
        raise TargetError(f"{what}: {where} holds no JSON object")
    return Fields(value, file=f"{what}: {where}", error=TargetError), where


def from_export(target: Target, export_dir: Path | str) -> None:
    """`export_dir`: an export directory, or an export on object storage (an `s3://` URL, a string)."""
    sidecar, where = _sidecar(export_dir)
    model = sidecar.obj("model", optional=True) or _none(sidecar, "model")
    run_dir = sidecar.str("run_dir", optional=True)  # a path, or the run's s3:// URL
    if run_dir and RunAt(run_dir).has_manifest():
        from_run(target, run_dir, features=False)
    target.model_type = target.model_type or model.str("model_type", optional=True)
    target.num_layers = target.num_layers or model.int("num_layers", optional=True, minimum=1)
    target.hidden_size = target.hidden_size or sidecar.int("hidden_size", optional=True)
    if target.num_layers is None:
        raise TargetError(f"--export: {where} names no model.num_layers")
    slots = [(s.str("role"), s.str("point")) for s in sidecar.objects("slots", optional=True)]
    aux = _points([point for role, point in slots if role == "aux"], target.num_layers, where)
    last = _points([point for role, point in slots if role == "last"], target.num_layers, where)
    trainer_format = sidecar.str("format", optional=True)
    last_state = sidecar.obj("last_state", optional=True)
    target.features = Features(aux=aux, last=last[0] if last else None, trainer_format=trainer_format,
                               run_points=_points(sidecar.list("run_points", "str", optional=True) or [],
                                                  target.num_layers, where),
                               source=f"export {export_dir} ({trainer_format})",
                               last_unnormed=bool(last_state and last_state.bool("derived", optional=True)))
    target.sources.append(f"export {export_dir}")


def gather(*, run: Path | str | None, export: Path | str | None, model_dir: Path | None) -> Target:
    target = Target()
    if export is not None:
        from_export(target, export)
    elif run is not None:
        from_run(target, run)
    if model_dir is not None:
        from_model_dir(target, model_dir)
    return target
