"""Pickle-free framing between the pipeline and an engine worker in another virtualenv.

A message is `<u64 header length><u64 payload length><JSON header><safetensors payload>`; tensors travel as
safetensors bytes, so nothing on either side ever unpickles data from the other.
"""
from __future__ import annotations

import json
import struct
from typing import Any, BinaryIO

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

_PREFIX = struct.Struct("<QQ")


class WorkerGone(RuntimeError):
    """The other side closed the pipe (it exited or crashed)."""


def send(f: BinaryIO, header: dict[str, Any], tensors: dict[str, torch.Tensor] | None = None) -> None:
    payload = st_save({k: v.contiguous() for k, v in tensors.items()}) if tensors else b""
    head = json.dumps(header).encode()
    f.write(_PREFIX.pack(len(head), len(payload)))
    f.write(head)
    f.write(payload)
    f.flush()


def _read_exact(f: BinaryIO, n: int) -> bytes:
    chunks, remaining = [], n
    while remaining:
        chunk = f.read(remaining)
        if not chunk:
            raise WorkerGone(f"pipe closed after {n - remaining} of {n} bytes")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def recv(f: BinaryIO) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    head_len, payload_len = _PREFIX.unpack(_read_exact(f, _PREFIX.size))
    header = json.loads(_read_exact(f, head_len))
    tensors = st_load(_read_exact(f, payload_len)) if payload_len else {}
    return header, tensors
