"""Raw safetensors I/O: write a file tensor by tensor, chunk by chunk, and read a header without mapping the file.

safetensors' own `save_file` needs every tensor whole in memory and then copies it to bytes, so writing a shard that
way costs about three shard sizes of RAM. Writing the (simple, documented) format ourselves streams each sample's
hidden states straight to disk: the writer adds no copy beyond one sample. Files are read back with the real
`safetensors` library in the reader, in verify (beside this parser's header) and in the tests, which is what keeps
this writer honest.
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import os
import struct
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Mapping

import numpy as np
import torch

from pipeline.core import jsonfile

_ALIGN = 8
_MAX_HEADER_BYTES = 100 << 20  # a guard against reading a corrupt length as a huge allocation
_MAX_PENDING = 64 << 20  # bytes written but not yet hashed
_PIECE = 16 << 20  # a large chunk is written, hashed and handed to the disk in pieces of this size


# torch dtype <-> safetensors code, for everything the pipeline stores or sends
DTYPE_CODES: dict[torch.dtype, str] = {
    torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float8_e4m3fn: "F8_E4M3",
    torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8", torch.bool: "BOOL",
}
CODE_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}


@dataclass(frozen=True, kw_only=True)
class TensorSpec:
    name: str
    dtype_code: str  # safetensors code, e.g. "BF16"
    shape: tuple[int, ...]
    num_bytes: int


@dataclass(frozen=True, kw_only=True)
class TensorInfo:
    dtype_code: str
    shape: tuple[int, ...]
    start: int  # absolute file offset of the first byte
    end: int  # absolute file offset one past the last byte


def header_bytes(specs: Iterable[TensorSpec], metadata: Mapping[str, str]) -> bytes:
    header: dict[str, object] = {"__metadata__": dict(metadata)}
    offset = 0
    for spec in specs:
        header[spec.name] = {"dtype": spec.dtype_code, "shape": list(spec.shape),
                             "data_offsets": [offset, offset + spec.num_bytes]}
        offset += spec.num_bytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    # The format allows trailing spaces in the header; padding puts the data start on an 8-byte boundary.
    raw += b" " * (-(8 + len(raw)) % _ALIGN)
    return struct.pack("<Q", len(raw)) + raw


class StreamingWriter:
    """Writes one safetensors file whose tensor list is declared up front and whose data arrives in chunks.

    Chunks must arrive in declaration order; `close` checks every declared byte was written. The sha256 and size of
    everything written are available afterwards, so the file never has to be read back to be hashed. The hashing runs
    on a helper thread while the main thread copies the same chunk into the page cache (both release the GIL): a shard
    costs about max(write, hash) instead of their sum. Every piece written is handed to the disk at once
    (`_start_writeback`), so the caller's closing fsync finds little left to do instead of a shard's worth: at Kimi's
    width that fsync was a third of a shard's write (bench/README.md#kimi_width). A chunk is held until it is hashed
    (at most _MAX_PENDING bytes of them), so a caller must not modify one in place before `close`. Use it as a
    context manager: leaving the block stops the helper thread, also when the write fails half way.
    """

    def __init__(self, f: BinaryIO, specs: list[TensorSpec], metadata: Mapping[str, str]) -> None:
        self._f = f
        self._specs = specs
        self._sha = hashlib.sha256()
        self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-sha256")
        self._pending: deque[tuple[Future, int]] = deque()
        self._pending_bytes = 0
        self.num_bytes = 0
        self._handed_to_disk = 0
        self._expected = sum(s.num_bytes for s in specs)
        self._write(header_bytes(specs, metadata))
        self._data_start = self.num_bytes

    def __enter__(self) -> "StreamingWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self._hasher.shutdown(wait=True, cancel_futures=True)

    def _write(self, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        for start in range(0, view.nbytes, _PIECE):
            piece = view[start:start + _PIECE]
            self._pending.append((self._hasher.submit(self._sha.update, piece), piece.nbytes))  # in order: 1 thread
            self._pending_bytes += piece.nbytes
            self._f.write(piece)
            self.num_bytes += piece.nbytes
            self._start_writeback()
            while self._pending_bytes > _MAX_PENDING:
                self._settle()

    def _start_writeback(self) -> None:
        """Start writing the bytes written so far to the disk, without waiting: POSIX_FADV_DONTNEED on Linux starts
        the writeback of dirty pages (and drops pages already clean: the shard is not read back here)."""
        if self.num_bytes - self._handed_to_disk < _PIECE:
            return
        try:
            self._f.flush()
            os.posix_fadvise(self._f.fileno(), self._handed_to_disk, self.num_bytes - self._handed_to_disk,
                             os.POSIX_FADV_DONTNEED)
        except (AttributeError, io.UnsupportedOperation):  # no such call here, or not a file: the fsync does it all
            pass
        self._handed_to_disk = self.num_bytes

    def _settle(self) -> None:
        done, size = self._pending.popleft()
        done.result()
        self._pending_bytes -= size

    def write_chunk(self, tensor: torch.Tensor) -> None:
        """Append the raw bytes of a tensor (any dtype torch can view as bytes)."""
        flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
        self._write(memoryview(flat.numpy()))

    def write_array(self, array: np.ndarray) -> None:
        self._write(memoryview(np.ascontiguousarray(array)).cast("B"))

    def close(self) -> str:
        """The sha256 of everything written; raises when the data do not fill the declared tensors."""
        while self._pending:
            self._settle()
        written = self.num_bytes - self._data_start
        if written != self._expected:
            raise ValueError(f"safetensors data: wrote {written} bytes, header declares {self._expected}")
        return self._sha.hexdigest()


def read_header(path: Path) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Parse a safetensors header with plain reads (no mmap), returning tensor infos and the metadata.

    Raises ValueError naming what is malformed.
    """
    file_bytes = Path(path).stat().st_size
    with open(path, "rb") as f:
        header_len = _header_length(f.read(8), file_bytes, path.name, "file")
        return _tensor_infos(f.read(header_len), 8 + header_len, path.name)


def read_header_ranged(read: Callable[[int, int], bytes], size: int, where: str
                       ) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """`read_header` of a file of `size` bytes read by ranges (`read(start, end)`: an object in a bucket): two
    requests, the length then the header."""
    header_len = _header_length(read(0, 8), size, where, "file")
    return _tensor_infos(read(8, 8 + header_len), 8 + header_len, where)


def _header_length(prefix: bytes, size: int, where: str, what: str) -> int:
    """The JSON header's length from the first 8 bytes of a safetensors image of `size` bytes."""
    if len(prefix) != 8:
        raise ValueError(f"{where}: {size} bytes, too short for a header")
    (header_len,) = struct.unpack("<Q", prefix)
    if header_len > min(_MAX_HEADER_BYTES, size - 8):
        raise ValueError(f"{where}: header length {header_len} exceeds the {what} ({size} bytes)")
    return header_len


def _tensor_infos(raw: bytes, data_start: int, where: str) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Tensor infos (absolute offsets) and metadata from the JSON header of an image whose data start at
    `data_start`."""
    try:
        header = jsonfile.parse(raw, ValueError, where="header", max_bytes=_MAX_HEADER_BYTES)  # nesting bounded
    except ValueError as exc:
        raise ValueError(f"{where}: header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{where}: header is a {type(header).__name__}, not an object")
    metadata = header.pop("__metadata__", None) or {}
    infos = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        infos[name] = TensorInfo(dtype_code=entry["dtype"], shape=tuple(entry["shape"]),
                                 start=data_start + begin, end=data_start + end)
    return infos, metadata


def tensors_from_buffer(buf: bytearray) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors image in memory, as views of `buf` (no copy; they keep `buf` alive).

    For data that never touches a disk (the engine worker's pipe); files are read with the safetensors library.
    """
    where = "safetensors image"
    header_len = _header_length(bytes(buf[:8]), len(buf), where, "image")
    infos, _ = _tensor_infos(bytes(buf[8:8 + header_len]), 8 + header_len, where)
    out = {}
    for name, info in infos.items():
        dtype = CODE_DTYPES.get(info.dtype_code)
        if dtype is None:
            raise ValueError(f"tensor {name!r}: dtype {info.dtype_code!r} is not one of {sorted(CODE_DTYPES)}")
        count = (info.end - info.start) // torch.empty(0, dtype=dtype).element_size()
        if count != math.prod(info.shape) or info.end > len(buf):
            raise ValueError(f"tensor {name!r}: {info.end - info.start} bytes at {info.start} do not hold shape "
                             f"{list(info.shape)} of {info.dtype_code} inside the image")
        out[name] = (torch.frombuffer(buf, dtype=dtype, count=count, offset=info.start).view(info.shape) if count
                     else torch.empty(info.shape, dtype=dtype))
    return out
