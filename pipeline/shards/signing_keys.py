"""The Ed25519 keys that sign a run's attestation and check it (pipeline.shards.attestation): read bounded from PEM,
refused in one line naming the file and why (an encrypted key, the wrong half, another algorithm)."""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from pipeline.core.cli import UsageError
from pipeline.core.io import read_bounded


class AttestationKeyError(UsageError, ValueError):
    """A signing or verification key that cannot be used (exit status 2): the message names the file and why."""


MAX_PEM_BYTES = 64 << 10  # an Ed25519 PEM key is about 120 bytes


def _read_pem(path: Path, what: str) -> bytes:
    """The key file's bytes, bounded (`sign_key=/dev/zero` read until memory ran out, a FIFO hung forever)."""
    try:
        data = read_bounded(Path(path), MAX_PEM_BYTES)
    except OSError as exc:
        raise AttestationKeyError(f"{what} {path}: cannot be read ({exc.strerror or exc})") from None
    if len(data) > MAX_PEM_BYTES:
        raise AttestationKeyError(f"{what} {path} is larger than {MAX_PEM_BYTES} bytes: not a PEM key")
    return data


def load_signing_key(path: str | Path) -> Ed25519PrivateKey:
    """An unencrypted Ed25519 private key in PEM (`openssl genpkey -algorithm ed25519 -out KEY`)."""
    data = _read_pem(Path(path), "signing key")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise AttestationKeyError(f"signing key {path} is encrypted: give an unencrypted Ed25519 PEM key, kept "
                                  "readable by the job alone") from None
    except (ValueError, UnsupportedAlgorithm) as exc:
        why = "that is a public key: give the private key that signs" if b"PUBLIC KEY" in data else str(exc)
        raise AttestationKeyError(f"signing key {path} is not a PEM private key ({why})") from None
    return _ed25519(key, Ed25519PrivateKey, f"signing key {path}")


def _ed25519(key: object, kind: type, what: str) -> Any:
    """`key` when it is an Ed25519 key of `kind`; else the error naming what it is."""
    if not isinstance(key, kind):
        raise AttestationKeyError(f"{what} is of type {type(key).__name__.removeprefix('_')}, not Ed25519")
    return key


def load_public_key(path: str | Path) -> Ed25519PublicKey:
    """An Ed25519 public key in PEM (`openssl pkey -in KEY -pubout -out PUB`)."""
    data = _read_pem(Path(path), "public key")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm) as exc:
        why = "that is a private key: give its public half" if b"PRIVATE KEY" in data else str(exc)
        raise AttestationKeyError(f"public key {path} is not a PEM public key ({why})") from None
    return _ed25519(key, Ed25519PublicKey, f"public key {path}")


def keyid(public: Ed25519PublicKey) -> str:
    """sha256 of the key's DER SubjectPublicKeyInfo (`openssl pkey -pubin -in PUB -outform DER | sha256sum`)."""
    der = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()
