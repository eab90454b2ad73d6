"""The run manifest: written last and atomically; its presence is what makes a run directory finished.

The caller builds the manifest dict (provenance, resolved config, diff and reject summaries, shard entries); this
module only owns where it lives and how it is written and read (every format version, through
pipeline.shards.formats). `REQUIRED_KEYS` are the ones the verifier and the reader depend on.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from pipeline.core.cli import UsageError
from pipeline.core.io import write_text_atomic
from pipeline.shards import formats, layout

REQUIRED_KEYS = ("format_version", "points", "hidden_size", "dtype", "shards", "num_samples", "num_tokens")


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


def read_manifest(run_dir: Path) -> dict[str, Any]:
    """The parsed manifest; ManifestError says whether it is missing (unfinished run) or corrupt."""
    path = manifest_path(run_dir)
    if not Path(run_dir).is_dir():
        raise ManifestError(f"run directory {run_dir} does not exist")
    if not path.is_file():
        raise ManifestError(f"unfinished run: {path} does not exist (the manifest is written last)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"manifest {path} is not valid JSON: {exc}") from exc
    if not isinstance(manifest, dict):
        raise ManifestError(f"manifest {path} holds a JSON {type(manifest).__name__}, not an object")
    missing = [key for key in REQUIRED_KEYS if key not in manifest]
    if missing:
        raise ManifestError(f"manifest {path} is missing required keys {missing}")
    try:
        return formats.read(manifest)
    except formats.FormatError as exc:
        raise ManifestError(f"manifest {path}: {exc}") from None


def is_finished(run_dir: Path) -> bool:
    """True when the run directory holds a readable manifest."""
    try:
        read_manifest(run_dir)
    except ManifestError:
        return False
    return True
