"""Every format version a run directory may be in, read into the current one: one small reader per version.

Version 3 (written now): version 2, where a Parquet row's `token_digest` covers the sample's loss mask, its offset in
the shard and its length as well as its token ids (pipeline.shards.layout.token_digest). Version 2: the manifest,
every shard entry and every shard's safetensors metadata carry their storage record, and the manifest its loss-token
total; `token_digest` is of the token ids alone (layout.ids_digest). Version 1 (this project's first format): the
same files, where runs made before storage was recorded lack those records (their states are stored as captured)
and a shard entry may carry `num_saturated`. A reader gives the manifest in version 3's shape, so nothing downstream
asks when a run was written, except for what a version defines differently (`row_digest`); `format_version` keeps
what the files say, and every shard of a run carries its manifest's version.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from pipeline.core.jsonfile import parse as parse_json
from pipeline.shards.layout import ids_digest, token_digest
from pipeline.shards.storage import NO_SCALING, Storage, parse

CURRENT = "3"
V2_KEYS = ("storage", "num_loss_tokens")  # what version 1 could lack (versions 2 and 3 require them)


class FormatError(ValueError):
    """A format version this code cannot read, or a version-2 file without what that version requires."""


def _captured(dtype: Any) -> dict[str, Any]:
    return {"dtype": dtype, "capture_dtype": dtype, "scaling": NO_SCALING}


def _v1_entry(entry: Any, dtype: Any) -> Any:
    if not isinstance(entry, dict):
        return entry  # verify names it
    entry = {k: v for k, v in entry.items() if k != "num_saturated"}
    return {**entry, "storage": entry.get("storage") or _captured(dtype)}


def _v1(manifest: dict[str, Any]) -> dict[str, Any]:
    out = dict(manifest)
    out.setdefault("storage", _captured(manifest.get("dtype")))
    if isinstance(manifest.get("shards"), list):
        out["shards"] = [_v1_entry(e, manifest.get("dtype")) for e in manifest["shards"]]
        totals = [e.get("num_loss_tokens") for e in out["shards"] if isinstance(e, dict)]
        if "num_loss_tokens" not in out and all(isinstance(t, int) for t in totals):
            out["num_loss_tokens"] = sum(totals)
    return out


def _requiring_storage(version: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def read(manifest: dict[str, Any]) -> dict[str, Any]:
        missing = [key for key in V2_KEYS if key not in manifest]
        if missing:
            raise FormatError(f"format_version {version} requires {missing}")
        return manifest
    return read


READERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "1": _v1, "2": _requiring_storage("2"), CURRENT: _requiring_storage(CURRENT)}


def row_digest(version: str) -> Callable[[np.ndarray, np.ndarray, int], str]:
    """What a Parquet row's `token_digest` is in format `version`: f(input_ids [T], loss_mask [T], offset)."""
    if str(version) in ("1", "2"):
        return lambda input_ids, loss_mask, offset: ids_digest(input_ids)
    return token_digest


def read(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest in the current shape; FormatError for a version no reader knows."""
    version = str(manifest.get("format_version"))
    if version not in READERS:
        raise FormatError(f"format_version={manifest.get('format_version')!r}: this code reads versions "
                          f"{', '.join(READERS)}")
    return READERS[version](manifest)


def shard_storage(text: str | None, version: str, run: Storage) -> Storage:
    """A shard's storage from its metadata: a version-1 shard without the record stores its states as captured (it
    agrees with a run that does, never with an fp8 run, whose shards need their scales)."""
    if text is None:
        if str(version) != "1":
            raise ValueError(f"no storage record (format_version {version} requires one)")
        if run.scaled:
            raise ValueError(f"no storage record, and the run stores {run.dtype} with scales")
        return run
    try:
        value = parse_json(text, ValueError, where="the value")
    except ValueError as e:
        raise ValueError(f"storage metadata is not JSON: {e}") from None
    return parse(value)
