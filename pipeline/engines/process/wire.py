"""Pickle-free framing between the pipeline and an engine worker in another virtualenv.

A message is `<u64 header length><u64 payload length><JSON header><safetensors payload>`; tensors travel in the
safetensors format, so nothing on either side ever unpickles data from the other. A payload is streamed tensor by
tensor into the pipe and read into one buffer whose tensors are views of it: a capture is not copied on its way
through (on a CPU node every copy of a shard's hidden states is time the engine does not compute).
"""
from __future__ import annotations

import json
import struct
from typing import Any, BinaryIO

import torch

from pipeline.core.stfile import (
    DTYPE_CODES,
    TensorSpec,
    header_bytes,
    tensors_from_buffer,
)

_PREFIX = struct.Struct("<QQ")


class WorkerGone(RuntimeError):
    """The other side closed the pipe (it exited or crashed)."""


def _layout(tensors: dict[str, torch.Tensor]) -> tuple[bytes, list[torch.Tensor], int]:
    """The safetensors header, the tensors in payload order and the payload's size. Widest dtype first, so every
    tensor starts on its natural alignment in the receiver's buffer (the data start is 8-aligned)."""
    named = sorted(((k, v.detach().contiguous()) for k, v in tensors.items()), key=lambda kv: -kv[1].element_size())
    specs = []
    for name, t in named:
        if t.dtype not in DTYPE_CODES:
            raise TypeError(f"tensor {name!r}: dtype {t.dtype} cannot be sent (one of {list(DTYPE_CODES)})")
        specs.append(TensorSpec(name=name, dtype_code=DTYPE_CODES[t.dtype], shape=tuple(t.shape),
                                num_bytes=t.numel() * t.element_size()))
    head = header_bytes(specs, {})
    return head, [t for _, t in named], len(head) + sum(spec.num_bytes for spec in specs)


def send(f: BinaryIO, header: dict[str, Any], tensors: dict[str, torch.Tensor] | None = None) -> None:
    head = json.dumps(header).encode()
    st_head, ordered, payload_len = _layout(tensors) if tensors else (b"", [], 0)
    f.write(_PREFIX.pack(len(head), payload_len))
    f.write(head)
    f.write(st_head)
    for t in ordered:
        if t.numel():
            f.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
    f.flush()


def _read_exact(f: BinaryIO, n: int) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        read = f.readinto(view[got:])
        if not read:
            raise WorkerGone(f"pipe closed after {got} of {n} bytes")
        got += read
    return buf


def recv(f: BinaryIO) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    head_len, payload_len = _PREFIX.unpack(_read_exact(f, _PREFIX.size))
    header = json.loads(_read_exact(f, head_len))
    tensors = tensors_from_buffer(_read_exact(f, payload_len)) if payload_len else {}
    return header, tensors
