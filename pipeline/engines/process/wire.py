"""Pickle-free framing between the pipeline and an engine worker in another virtualenv.

A message is `<u64 header length><u64 payload length><u8 where><JSON header>` followed by its payload: the tensors in
the safetensors format, so nothing on either side ever unpickles data from the other. The payload travels one of two
ways (`where`):
- INLINE: streamed tensor by tensor into the pipe after the header and read into one buffer whose tensors are views
  of it (small messages, and any channel without a side socket);
- SHARED: written once into a memfd (an anonymous shared-memory file) whose descriptor crosses a Unix socket beside
  the pipe (SCM_RIGHTS); the receiver maps it and its tensors are views of the mapping. A capture then costs one
  copy in the engine's process instead of two through the kernel's pipe plus a wake-up per pipe's worth
  (bench/README.md#kimi_width: at Kimi's width that decided whether the host path kept up). Only the descriptor and
  the header cross, and the memory is freed when the last view of it is dropped, in whichever process.
"""
from __future__ import annotations

import json
import mmap
import os
import socket
import struct
from typing import Any, BinaryIO

import torch

from pipeline.core.stfile import (
    DTYPE_CODES,
    TensorSpec,
    header_bytes,
    tensors_from_buffer,
)

_PREFIX = struct.Struct("<QQB")
INLINE, SHARED = 0, 1
SHARED_MIN_BYTES = 1 << 20  # below this a payload goes through the pipe: a memfd costs a few system calls
_WRITE_BLOCK = 1 << 30  # os.write moves at most ~2 GiB per call


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


def _chunks(st_head: bytes, ordered: list[torch.Tensor]):
    yield memoryview(st_head)
    for t in ordered:
        if t.numel():
            yield memoryview(t.reshape(-1).view(torch.uint8).numpy())


def _to_memfd(st_head: bytes, ordered: list[torch.Tensor]) -> int:
    """A memfd holding the payload. Written with write(2): the kernel copies into freshly allocated pages in one
    pass (a mapping would first fault in and zero every page)."""
    fd = os.memfd_create("pipeline-wire", os.MFD_CLOEXEC)
    try:
        for chunk in _chunks(st_head, ordered):
            for start in range(0, chunk.nbytes, _WRITE_BLOCK):
                part, done = chunk[start:start + _WRITE_BLOCK], 0
                while done < part.nbytes:
                    done += os.write(fd, part[done:])
    except BaseException:
        os.close(fd)
        raise
    return fd


def send(f: BinaryIO, header: dict[str, Any], tensors: dict[str, torch.Tensor] | None = None,
         side: socket.socket | None = None) -> None:
    """Send one message; with `side` (the Unix socket beside the pipe), a large payload goes as a memfd."""
    head = json.dumps(header).encode()
    st_head, ordered, payload_len = _layout(tensors) if tensors else (b"", [], 0)
    where = SHARED if side is not None and payload_len >= SHARED_MIN_BYTES else INLINE
    if where == SHARED:
        fd = _to_memfd(st_head, ordered)
        try:  # the descriptor goes first: the receiver takes it when the prefix says so
            socket.send_fds(side, [b"m"], [fd])
        finally:
            os.close(fd)
    f.write(_PREFIX.pack(len(head), payload_len, where))
    f.write(head)
    if where == INLINE:
        for chunk in _chunks(st_head, ordered):
            f.write(chunk)
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


def _map_shared(side: socket.socket | None, payload_len: int) -> mmap.mmap:
    if side is None:
        raise ValueError("a shared-memory payload arrived on a channel without a side socket")
    _, fds, _, _ = socket.recv_fds(side, 1, 1)
    if len(fds) != 1:
        raise WorkerGone("the side socket closed before the payload's descriptor arrived")
    try:
        size = os.fstat(fds[0]).st_size
        if size != payload_len:
            raise ValueError(f"shared payload holds {size} bytes, the message announced {payload_len}")
        # MAP_POPULATE: the page tables are filled in one call instead of one fault per page on first read.
        return mmap.mmap(fds[0], payload_len, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
    finally:
        os.close(fds[0])


def recv(f: BinaryIO, side: socket.socket | None = None) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    head_len, payload_len, where = _PREFIX.unpack(_read_exact(f, _PREFIX.size))
    header = json.loads(_read_exact(f, head_len))
    if not payload_len:
        return header, {}
    if where == SHARED:
        return header, tensors_from_buffer(_map_shared(side, payload_len))
    if where != INLINE:
        raise ValueError(f"message prefix names payload transport {where}, not {INLINE} or {SHARED}")
    return header, tensors_from_buffer(_read_exact(f, payload_len))
