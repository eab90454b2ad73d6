"""Names, paths and dtypes of the on-disk shard format, shared by the writer, the reader and the verifier."""
from __future__ import annotations

import hashlib
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

FORMAT_VERSION = "1"
SHARDS_DIR = "shards"
MANIFEST_NAME = "manifest.json"

# Tensor names inside a shard's .safetensors file, in the order they are laid out: 8-byte types first so every tensor
# starts on its natural alignment for zero-copy readers.
INPUT_IDS = "input_ids"
SAMPLE_OFFSETS = "sample_offsets"
HIDDEN_STATES = "hidden_states"
LOSS_MASK = "loss_mask"
TENSOR_NAMES = (INPUT_IDS, SAMPLE_OFFSETS, HIDDEN_STATES, LOSS_MASK)

# Safetensors metadata keys the writer owns; caller metadata may not override them.
META_POINTS = "points"
META_FORMAT_VERSION = "format_version"
RESERVED_METADATA = (META_POINTS, META_FORMAT_VERSION)

PARQUET_COLUMNS = ("sample_id", "source", "row", "offset", "num_tokens", "num_loss_tokens", "truncated",
                   "token_digest")

# dtype name (as in the manifest) -> (torch dtype, safetensors dtype code)
HIDDEN_DTYPES: dict[str, tuple[torch.dtype, str]] = {
    "float32": (torch.float32, "F32"),
    "float16": (torch.float16, "F16"),
    "bfloat16": (torch.bfloat16, "BF16"),
    "float8_e4m3fn": (torch.float8_e4m3fn, "F8_E4M3"),
}
INDEX_DTYPES: dict[str, tuple[torch.dtype, str]] = {
    INPUT_IDS: (torch.int64, "I64"),
    SAMPLE_OFFSETS: (torch.int64, "I64"),
    LOSS_MASK: (torch.uint8, "U8"),
}


def shard_name(index: int) -> str:
    if index < 0:
        raise ValueError(f"shard index={index} must be >= 0")
    return f"shard-{index:05d}"


def shard_paths(run_dir: Path, index: int) -> dict[str, Path]:
    """The three files of shard `index`: safetensors, parquet and the completion marker (written last)."""
    base = Path(run_dir) / SHARDS_DIR / shard_name(index)
    return {"safetensors": base.with_suffix(".safetensors"), "parquet": base.with_suffix(".parquet"),
            "marker": base.with_suffix(".done.json")}


def dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in HIDDEN_DTYPES:
        raise ValueError(f"hidden state dtype={name} is not storable; supported: {', '.join(HIDDEN_DTYPES)}")
    return name


def token_digest(input_ids_T: np.ndarray) -> str:
    """sha256 of the token ids as little-endian int64 bytes (independent of the array's own dtype)."""
    return hashlib.sha256(np.ascontiguousarray(input_ids_T, dtype="<i8").tobytes()).hexdigest()


def file_sha256(path: Path, *, chunk_bytes: int = 8 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk_bytes):
            digest.update(block)
    return digest.hexdigest()


def _umask() -> int:
    mask = os.umask(0)  # the only way to read it sets it: done once, at import, before any writer thread exists
    os.umask(mask)
    return mask


# mkstemp creates files 0600; a finished file gets the mode open() would have given it, so a trainer running as
# another user of the cluster can read the run.
FILE_MODE = 0o666 & ~_umask()


@contextmanager
def atomic_path(final: Path) -> Iterator[Path]:
    """Yield a temp path beside `final`; on success fsync and rename it over `final`, on failure remove it.

    The temp file lives in the same directory so os.replace is an atomic rename, and a reader never sees a
    half-written file under the final name.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp_path, FILE_MODE)
        os.replace(tmp_path, final)
    finally:
        tmp_path.unlink(missing_ok=True)


def write_text_atomic(final: Path, text: str) -> None:
    with atomic_path(final) as tmp:
        tmp.write_text(text, encoding="utf-8")
