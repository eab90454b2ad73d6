"""The run manifest: written last and atomically; its presence is what makes a run directory finished.

The caller builds the manifest dict (provenance, resolved config, diff and reject summaries, shard entries); this
module only owns where it lives and how it is written and read (every format version, through
pipeline.shards.formats). `REQUIRED_KEYS` are the ones the verifier and the reader depend on.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from pipeline.core import jsonfile
from pipeline.core.cli import UsageError
from pipeline.core.io import write_text_atomic
from pipeline.core.jsonfile import Fields
from pipeline.core.storage import Store
from pipeline.core.stores import store_of
from pipeline.shards import formats, layout

REQUIRED_KEYS = ("format_version", "points", "hidden_size", "dtype", "shards", "num_samples", "num_tokens")
MAX_BYTES = 256 << 20  # about 1 kB per shard entry: a quarter of a million shards


class ManifestError(UsageError, ValueError):
    """The manifest is missing (an unfinished run) or cannot be read."""


def manifest_path(run_dir: Path) -> Path:
    return Path(run_dir) / layout.MANIFEST_NAME


def manifest_text(manifest: Mapping[str, Any]) -> str:
    """manifest.json's exact text: keys sorted, indented (what the run's attestation digests before it is written)."""
    missing = [key for key in (*REQUIRED_KEYS, *formats.V2_KEYS) if key not in manifest]
    if missing:
        raise ManifestError(f"manifest is missing required keys {missing}")
    return json.dumps(manifest, sort_keys=True, indent=2, allow_nan=False) + "\n"


def write_manifest(run_dir: Path, manifest: Mapping[str, Any]) -> Path:
    """Write manifest.json atomically (temp file + rename); returns its path."""
    path = manifest_path(run_dir)
    write_text_atomic(path, manifest_text(manifest))
    return path


def _check_types(manifest: dict[str, Any], path: Path | str) -> None:
    """The fields the verifier, the reader, the exporters and the doctor take apart, each of its JSON type (their
    values are verify's to judge); ManifestError names the field."""
    fields = Fields(manifest, file=f"manifest {path}", error=ManifestError)
    fields.list("points", "str")
    fields.int("hidden_size")
    fields.str("dtype")
    fields.list("shards", "object")
    for key in ("num_samples", "num_tokens"):
        fields.int(key)
    for key in ("num_loss_tokens", "num_truncated"):
        fields.int(key, optional=True)
    for key in ("storage", "rejects"):
        fields.obj(key, optional=True)
    fields.str("provenance_digest", optional=True)
    prov = fields.obj("provenance", optional=True)
    for key in ("engine", "capture", "config", "diff") if prov is not None else ():
        prov.obj(key, optional=True)
    model = prov.obj("model", optional=True) if prov is not None else None
    if model is not None:
        model.int("num_layers", optional=True)
        for key in ("model_type", "architecture", "path"):
            model.str(key, optional=True)


def read_manifest(run_dir: Path | str, *, store: Store | None = None) -> dict[str, Any]:
    """The parsed manifest (bounded: `MAX_BYTES`, nesting `MAX_DEPTH`), every field readers take apart of its type;
    ManifestError says whether it is missing (unfinished run), corrupt or which field is wrong. `run_dir` may be an
    `s3://bucket/prefix` URL (a string); `store`: the caller's open store of that URL."""
    manifest, path = _load(run_dir, store or store_of(run_dir))
    if not isinstance(manifest, dict):
        raise ManifestError(f"manifest {path} holds a JSON {type(manifest).__name__}, not an object")
    missing = [key for key in REQUIRED_KEYS if key not in manifest]
    if missing:
        raise ManifestError(f"manifest {path} is missing required keys {missing}")
    _check_types(manifest, path)
    try:
        return formats.read(manifest)
    except formats.FormatError as exc:
        raise ManifestError(f"manifest {path}: {exc}") from None


def _load(run_dir: Path | str, store: Store | None) -> tuple[Any, Path | str]:
    """The manifest's JSON value and where it was read."""
    if store is not None:
        where = f"{store.url}/{layout.MANIFEST_NAME}"
        try:
            raw = store.get(layout.MANIFEST_NAME, 0, MAX_BYTES + 1)
        except FileNotFoundError:
            raise ManifestError(f"unfinished run: {where} does not exist (the manifest is written last)") from None
        return jsonfile.parse(raw, ManifestError, where=f"manifest {where}", max_bytes=MAX_BYTES), where
    path = manifest_path(run_dir)
    if not Path(run_dir).is_dir():
        raise ManifestError(f"run directory {run_dir} does not exist")
    if not path.is_file():
        raise ManifestError(f"unfinished run: {path} does not exist (the manifest is written last)")
    return jsonfile.read(path, ManifestError, prefix="manifest ", max_bytes=MAX_BYTES), path


def is_finished(run_dir: Path) -> bool:
    """True when the run directory holds a readable manifest."""
    try:
        read_manifest(run_dir)
    except ManifestError:
        return False
    return True
