"""Compressed data files, recognised by content and decompressed by pyarrow's codecs (no hand-written decoding).

A file is gzip, zstd or bz2 when its first bytes are that format's magic number, whatever its name says: `data.jsonl`
holding gzip is read as gzip, `data.jsonl.gz` holding plain text as plain text. Its format (JSONL, JSON, Parquet) is
the name's suffix once a compression suffix is dropped (`data.jsonl.zst` is JSONL). A stream that does not decompress
(a file cut short, a corrupt block) is a ValueError naming the file and the codec, never a half-read dataset.
"""
from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa

# (magic number, pyarrow codec); bz2's magic is "BZh" and a block-size digit
MAGIC = ((b"\x1f\x8b", "gzip"), (b"\x28\xb5\x2f\xfd", "zstd"), *((b"BZh" + bytes([d]), "bz2") for d in b"123456789"))
COMPRESSION_SUFFIXES = (".gz", ".gzip", ".zst", ".zstd", ".bz2")
_BUFFER = 1 << 20


def codec_of(path: Path) -> str | None:
    """The compression `path` holds by its first bytes (gzip, zstd, bz2), or None for an uncompressed file."""
    with open(path, "rb") as f:
        head = f.read(4)
    return next((codec for magic, codec in MAGIC if head.startswith(magic)), None)


def format_suffix(path: Path) -> str:
    """The data format's suffix (".jsonl", ".json", ".parquet", ...): the last suffix once a compression one is
    dropped."""
    name = path.name.lower()
    for suffix in COMPRESSION_SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return Path(name).suffix


class _Checked(io.RawIOBase):
    """A decompressing stream whose codec errors (pyarrow raises them as OSError without an errno) are ValueErrors
    naming the file; an OSError with an errno (the disk's) passes through as it is."""

    def __init__(self, stream: pa.NativeFile, path: Path, codec: str) -> None:
        self._stream, self._path, self._codec = stream, path, codec

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:
        try:
            return self._stream.readinto(buffer)
        except OSError as e:
            if e.errno is not None:
                raise
            raise ValueError(f"{self._path} is not valid {self._codec} data ({e}): the file is corrupt or was cut "
                             "short") from e

    def close(self) -> None:
        self._stream.close()
        super().close()


@contextmanager
def open_data(path: Path) -> Iterator[BinaryIO]:
    """The file's content as a buffered binary stream (lines, reads), decompressed when the file is compressed."""
    codec = codec_of(path)
    if codec is None:
        with open(path, "rb") as f:
            yield f
        return
    with io.BufferedReader(_Checked(pa.input_stream(str(path), compression=codec), path, codec), _BUFFER) as f:
        yield f  # type: ignore[misc]


def read_all(path: Path) -> bytes:
    with open_data(path) as f:
        return f.read()
