"""A finished run where it is stored, a local directory or `s3://bucket/prefix`: what an export, the doctor and the
trainer's backend read of it besides its samples (its manifest and that file's sha256, its attestation's record, its
files' fingerprints, a full verification), the same way on both. Samples are read through `RunReader`, which takes
either location itself.

A fingerprint is what a trainer's start compares without reading the shards: a local file's size and mtime, an
object's size and ETag (a rewritten object has a new ETag, as a rewritten file a new mtime)."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Mapping

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from pipeline.core.io import sha256_file
from pipeline.core.storage import Store
from pipeline.core.stores import store_of
from pipeline.shards import attestation
from pipeline.shards import layout
from pipeline.shards.manifest import read_manifest
from pipeline.shards.staged import staged
from pipeline.shards.verify import verify_run


class RunAt:
    """The run at `location` (a path, or an `s3://` URL given as a string)."""

    def __init__(self, location: str | os.PathLike) -> None:
        self.store: Store | None = store_of(location)
        self.location: Path | str = location if self.store is not None else Path(location)

    @property
    def name(self) -> str:
        """How messages and sidecars name it: the URL (never a credential), or the absolute path."""
        return self.store.url if self.store is not None else str(Path(self.location).resolve())

    def manifest(self) -> dict[str, Any]:
        """The parsed manifest (ManifestError: not a finished run)."""
        return read_manifest(self.location, store=self.store)

    def has_manifest(self) -> bool:
        if self.store is not None:
            return self.store.head(layout.MANIFEST_NAME) is not None
        return (Path(self.location) / layout.MANIFEST_NAME).is_file()

    def manifest_sha256(self) -> str:
        if self.store is not None:
            return hashlib.sha256(self.store.get(layout.MANIFEST_NAME)).hexdigest()  # bounded by read_manifest's check
        return sha256_file(Path(self.location) / layout.MANIFEST_NAME)

    def attestation(self) -> dict[str, Any] | None:
        return attestation.record(None if self.store is not None else Path(self.location), store=self.store)

    def fingerprint(self, manifest: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """Every file the manifest lists (its shards): {"bytes", "mtime_ns"} on disk, {"bytes", "etag"} in a bucket."""
        rels = sorted({rel for entry in manifest["shards"] for rel in entry["files"]})
        found = self._now(rels)
        if missing := [rel for rel in rels if rel not in found]:
            raise FileNotFoundError(f"{self.where(missing[0])} is missing (the manifest lists it)")
        return found

    def changes(self, fingerprint: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, str, dict[str, Any] | None]]:
        """(file, why, what is there now) for each file of `fingerprint` that is not the one it records, in its order:
        why is "missing", "resized" or "modified" (the same size, another mtime or ETag)."""
        version = "etag" if self.store is not None else "mtime_ns"
        now = self._now(list(fingerprint))
        out = []
        for rel, want in fingerprint.items():
            found = now.get(rel)
            why = "missing" if found is None else "resized" if found["bytes"] != want["bytes"] else \
                "modified" if found[version] != want.get(version) else None
            if why is not None:
                out.append((rel, why, found))
        return out

    def _now(self, rels: list[str]) -> dict[str, dict[str, Any]]:
        """The fingerprint of each of `rels` that is there. In a bucket the shards are listed once (a thousand keys a
        request), not asked for one by one: a trainer's every data loader worker checks them as it starts."""
        if self.store is not None:
            listing = {o.key: o for o in self.store.list(layout.SHARDS_DIR + "/")}
            return {rel: {"bytes": listing[rel].size, "etag": listing[rel].etag} for rel in rels if rel in listing}
        out = {}
        for rel in rels:
            try:
                st = os.stat(Path(self.location) / rel)
            except FileNotFoundError:
                continue
            out[rel] = {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
        return out

    def where(self, rel: str) -> str:
        return f"{self.store.url}/{rel}" if self.store is not None else str(Path(self.location) / rel)

    def verify(self, key: Ed25519PublicKey | None = None, scratch: str | Path | None = None) -> tuple[list[str], str]:
        """(every problem `pipeline.verify` finds, its words about the attestation). A run in a bucket is read
        through a staged copy in `scratch` (pipeline.shards.staged): every byte read, one shard's states staged at a
        time."""
        if self.store is None:
            return verify_run(Path(self.location), key=key), attestation.proof_text(Path(self.location), key)
        with staged(self.store, scratch) as (root, fetch):
            problems = [p.replace(str(root), self.store.url) for p in verify_run(root, key=key, fetch=fetch)]
            return problems, attestation.proof_text(root, key)
