"""The run's provenance as an in-toto attestation, signed when the user gives a key: what `verify --key` proves.

`attestation.intoto.json` (written by extract just before the manifest, so a finished run always has it) is a DSSE
envelope (https://github.com/secure-systems-lab/dsse) whose payload, of type `application/vnd.in-toto+json`, is an
in-toto Statement v1: its subjects are every file of the run (each path relative to the run directory, with its
sha256; all but the out_dir lock and the attestation itself), its predicate the manifest's provenance record
(`PREDICATE_TYPE`). With `sign_key=PATH` (an Ed25519 private key, PEM) the envelope carries one signature over DSSE's
pre-authentication encoding of the payload; without one its signature list is empty.

Without a key, the attestation is one more set of checksums that a forger can recompute. With the signer's public key
(`python -m pipeline.verify RUN --key PUB`), a valid signature proves the statement was made by the key's holder, and
matching subjects prove every file is byte for byte what that holder's extract wrote.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
from pathlib import Path
from typing import Any, Iterable, Mapping

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from pipeline.core import jsonfile
from pipeline.core.io import read_bounded, sha256_file, write_text_atomic
from pipeline.core.storage import Store, chunks
from pipeline.shards import layout
from pipeline.shards.signing_keys import keyid
from pipeline.shards.verify_tree import escape_problem, through_symlink

MAX_BYTES = 256 << 20  # read back bounded as a manifest is: one subject per file of the run

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
PREDICATE_TYPE = "urn:pipeline:run-provenance:v1"  # the predicate: a manifest's `provenance` record, as it is
NAME = layout.ATTESTATION_NAME
_NOT_SUBJECTS = (layout.LOCK_NAME, NAME)  # the lock's lease changes while the run holds it; the attestation itself
_MAX_LISTED = 3


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what is signed."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def run_files(run_dir: Path, listed: Mapping[str, str]) -> list[str]:
    """The files of the run its attestation covers, sorted: the files a run writes (pipeline.core.outdir.Layout.walk:
    no symlink, no temp file), in shards/ only the `listed` ones and their shards' markers."""
    return subject_names((e.rel for e in layout.RUN.walk(run_dir) if e.what == "file"), listed)


def subject_names(rels: Iterable[str], listed: Mapping[str, str]) -> list[str]:
    """Of a run's files (relative to it), those its attestation covers, sorted: all but the lock and the
    attestation, in shards/ only the `listed` ones and their shards' markers."""
    bases, marker = _shard_bases(listed), layout.SHARD_SUFFIXES["marker"]
    return sorted(rel for rel in rels if rel not in _NOT_SUBJECTS and (
        not rel.startswith(f"{layout.SHARDS_DIR}/") or rel in listed or rel.removesuffix(marker) in bases))


def _shard_bases(listed: Mapping[str, str]) -> set[str]:
    suffixes = tuple(layout.SHARD_SUFFIXES[k] for k in ("safetensors", "parquet"))
    return {rel.removesuffix(s) for rel in listed for s in suffixes if rel.endswith(s)}


def listed_digests(manifest: Mapping[str, Any]) -> dict[str, str]:
    """The sha256 the manifest records for every shard file (computed by the writer as it wrote them)."""
    out = {}
    for entry in manifest.get("shards") or []:
        for rel, info in ((entry or {}).get("files") or {}).items() if isinstance(entry, dict) else ():
            if isinstance(info, dict) and isinstance(info.get("sha256"), str):
                out[rel] = info["sha256"]
    return out


def statement(run_dir: Path, manifest: Mapping[str, Any], manifest_text: str, *,
              store: Store | None = None) -> dict[str, Any]:
    """The Statement for a run about to be finished with `manifest_text` as its manifest.json (in `run_dir`, or on
    `store`: its objects the run's layout owns). Shard files are given the sha256 their writer recorded (no shard is
    read twice); the other files are hashed here."""
    listed = listed_digests(manifest)
    digests = {**listed, layout.MANIFEST_NAME: hashlib.sha256(manifest_text.encode()).hexdigest()}
    if store is None:
        names, digest = run_files(run_dir, listed), lambda rel: sha256_file(Path(run_dir) / rel)
    else:
        keys = [o.key for o in store.list()]
        foreign = set(layout.RUN.foreign_keys(keys))
        names = subject_names((k for k in keys if k not in foreign), listed)
        digest = lambda rel: hashlib.sha256(store.get(rel)).hexdigest()  # noqa: E731 (small files: no shard)
    subjects = [{"name": rel, "digest": {"sha256": digests.get(rel) or digest(rel)}}
                for rel in sorted(set(names) | {layout.MANIFEST_NAME})]
    return {"_type": STATEMENT_TYPE, "subject": subjects, "predicateType": PREDICATE_TYPE,
            "predicate": manifest.get("provenance")}


def envelope(stmt: Mapping[str, Any], key: Ed25519PrivateKey | None) -> dict[str, Any]:
    payload = json.dumps(stmt, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    signatures = [] if key is None else [{"keyid": keyid(key.public_key()),
                                          "sig": base64.b64encode(key.sign(pae(PAYLOAD_TYPE, payload))).decode()}]
    return {"payloadType": PAYLOAD_TYPE, "payload": base64.b64encode(payload).decode(), "signatures": signatures}


def write(run_dir: Path, manifest: Mapping[str, Any], manifest_text: str,
          key: Ed25519PrivateKey | None = None, *, store: Store | None = None) -> None:
    """Write the run's attestation (atomically, or as one object of `store`), signed with `key` when given; before
    the manifest."""
    stmt = statement(run_dir, manifest, manifest_text, store=store)
    text = json.dumps(envelope(stmt, key), indent=2, sort_keys=True) + "\n"
    if store is not None:
        store.put(NAME, text.encode())
    else:
        write_text_atomic(Path(run_dir) / NAME, text)


def record(run_dir: Path | None, *, store: Store | None = None) -> dict[str, Any] | None:
    """What an export carries: the attestation's sha256 (the file's), its statement's, and the keyids its signatures
    claim (`claimed_keyids`: a label anyone can write; `pipeline.verify RUN --key PUB` is what checks one); None for
    a run without one (format 1 and 2). `store`: the run is that store's (object storage), `run_dir` unused."""
    if store is not None:
        if (info := store.head(NAME)) is None:
            return None
        raw, digest = store.get(NAME, 0, MAX_BYTES + 1), _object_sha256(store, NAME, info.size)
    else:
        path = Path(run_dir) / NAME
        if not path.is_file():
            return None
        raw, digest = read_bounded(path, MAX_BYTES), sha256_file(path)
    env, problem = _parsed(raw)
    payload, _, problem = _statement(env) if problem is None else (b"", {}, problem)
    if problem:
        return {"sha256": digest, "statement_sha256": None, "claimed_keyids": []}
    return {"sha256": digest, "statement_sha256": hashlib.sha256(payload).hexdigest(),
            "claimed_keyids": sorted({str(s.get("keyid")) for s in env["signatures"] if isinstance(s, dict)})}


def _object_sha256(store: Store, key: str, size: int) -> str:
    """sha256 of an object, read by ranges (`chunks`)."""
    h = hashlib.sha256()
    for chunk in chunks(store, key, size):
        h.update(chunk)
    return h.hexdigest()


def _read(path: Path) -> tuple[dict[str, Any], str | None]:
    """The envelope, or why it is not one."""
    try:
        env = jsonfile.read(path, ValueError, max_bytes=MAX_BYTES)
    except ValueError as exc:
        return {}, f"{NAME} is not JSON ({exc})"
    return _envelope(env)


def _parsed(raw: bytes) -> tuple[dict[str, Any], str | None]:
    """The envelope in `raw`, or why it is not one."""
    try:
        env = jsonfile.parse(raw, ValueError, where=NAME, max_bytes=MAX_BYTES)
    except ValueError as exc:
        return {}, f"{NAME} is not JSON ({exc})"
    return _envelope(env)


def _envelope(env: Any) -> tuple[dict[str, Any], str | None]:
    if not isinstance(env, dict) or env.get("payloadType") != PAYLOAD_TYPE or not isinstance(env.get("payload"), str) \
            or not isinstance(env.get("signatures"), list):
        return {}, f"{NAME} is not a DSSE envelope of an in-toto statement (payloadType {PAYLOAD_TYPE!r}, payload, " \
                   "signatures)"
    return env, None


def _statement(env: dict[str, Any]) -> tuple[bytes, dict[str, Any], str | None]:
    try:
        payload = base64.b64decode(env["payload"], validate=True)
        stmt = jsonfile.parse(payload, ValueError, where="the payload", max_bytes=MAX_BYTES)
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        return b"", {}, f"{NAME}: its payload is not a base64 JSON statement ({type(exc).__name__}: {exc})"
    subjects = stmt.get("subject") if isinstance(stmt, dict) else None
    if not isinstance(stmt, dict) or stmt.get("_type") != STATEMENT_TYPE or stmt.get("predicateType") != \
            PREDICATE_TYPE or not isinstance(subjects, list) or not all(_is_subject(s) for s in subjects):
        return b"", {}, f"{NAME}: its payload is not an in-toto Statement v1 of a run's provenance ({PREDICATE_TYPE})"
    return payload, stmt, None


def _is_subject(s: Any) -> bool:
    return isinstance(s, dict) and isinstance(s.get("name"), str) and isinstance(s.get("digest"), dict) \
        and isinstance(s["digest"].get("sha256"), str)


def _signature_problems(env: dict[str, Any], payload: bytes, key: Ed25519PublicKey) -> list[str]:
    want, signed = keyid(key), []
    for sig in env["signatures"]:
        if not isinstance(sig, dict):
            continue
        signed.append(str(sig.get("keyid")))
        try:
            key.verify(base64.b64decode(str(sig.get("sig")), validate=True), pae(PAYLOAD_TYPE, payload))
        except (InvalidSignature, binascii.Error, ValueError):
            continue
        return []
    if not signed:
        return [f"{NAME} is not signed: --key {want[:16]}... can prove nothing about this run (it was written without "
                "sign_key, or its signature was removed)"]
    return [f"{NAME}: no signature verifies with --key (keyid {want[:16]}...; signatures by keyid "
            f"{', '.join(k[:16] + '...' for k in signed)}): the run was not attested by that key's holder, or was "
            "changed after it was signed"]


def _subject_problems(run_dir: Path, manifest: dict[str, Any], stmt: dict[str, Any],
                      hashed: dict[str, str]) -> list[str]:
    attested = {s["name"]: s["digest"]["sha256"] for s in stmt["subject"]}
    differ = []
    for rel, want in sorted(attested.items()):
        path = Path(run_dir) / rel
        if escape_problem(rel) is not None or through_symlink(Path(run_dir), rel):
            differ.append(f"{rel} (not a file inside the run)")
        elif rel not in hashed and not path.is_file():  # hashed: read already (a staged run's states are gone since)
            differ.append(f"{rel} (missing)")
        elif (got := hashed.get(rel) or hashed.setdefault(rel, sha256_file(path))) != want:
            differ.append(f"{rel} (sha256 {got[:12]}..., attested {want[:12]}...)")
    unattested = [rel for rel in run_files(run_dir, listed_digests(manifest)) if rel not in attested]
    problems = []
    if differ:
        problems.append(f"{NAME}: {len(differ)} file(s) differ from what it attests: "
                        f"{', '.join(differ[:_MAX_LISTED])}{' ...' if len(differ) > _MAX_LISTED else ''}")
    if unattested:
        problems.append(f"{NAME}: {len(unattested)} file(s) of the run are not attested: "
                        f"{', '.join(unattested[:_MAX_LISTED])}{' ...' if len(unattested) > _MAX_LISTED else ''}")
    if stmt.get("predicate") != manifest.get("provenance"):
        problems.append(f"{NAME}: its predicate is not the manifest's provenance")
    return problems


def problems(run_dir: Path, manifest: dict[str, Any], key: Ed25519PublicKey | None = None,
             hashed: dict[str, str] | None = None) -> list[str]:
    """Every way the run differs from its attestation; with `key`, also a missing or invalid signature. `hashed`:
    sha256 of files already read (relative path -> hex), filled in with those read here."""
    path = Path(run_dir) / NAME
    recorded = manifest.get("attestation")
    if path.is_symlink():
        return []  # named by the tree check
    if not path.is_file():
        if recorded:
            return [f"{NAME} is missing, though the manifest records one"]
        return [f"run has no {NAME}: --key can prove nothing about it (runs of format 1 and 2 have none; this one "
                f"says format {manifest.get('format_version')})"] if key is not None else []
    env, problem = _read(path)
    if problem:
        return [problem]
    payload, stmt, problem = _statement(env)
    if problem:
        return [problem]
    found = _signature_problems(env, payload, key) if key is not None else []
    return found + _subject_problems(run_dir, manifest, stmt, {} if hashed is None else hashed)


def proof_text(run_dir: Path, key: Ed25519PublicKey | None) -> str:
    """The sound summary's words about the attestation (verify has found no problem with it)."""
    found = record(run_dir)
    if found is None:
        return "no attestation (a run of an older format): checksums only"
    if key is not None:
        return f"attestation signed by keyid {keyid(key)[:16]}... (--key): every file is what that key's holder wrote"
    if found["claimed_keyids"]:
        claimed = ", ".join(k[:16] + "..." for k in found["claimed_keyids"])
        return f"attestation signed by keyid {claimed}, not checked (pass --key PUB to prove who wrote the run)"
    return "attestation unsigned: its checksums match, which a forger could recompute (sign with sign_key=PATH)"
