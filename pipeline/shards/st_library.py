"""A shard as the `safetensors` library itself reads it: its header, and the tensors verify checks.

The writer streams shards with the pipeline's own parser (core/stfile.py); a verifier on that parser alone would
agree with the writer by construction. The library is what every trainer and the reader use, and it is stricter than
the hand parser: it refuses data offsets that leave a gap, overlap or do not end at the end of the file, a header
that does not start with '{', a metadata value that is not a string, a dtype it does not know. So verify reads the
header both ways and every tensor it checks through the library.

The library memory-maps the file, and pages touched through one open handle stay resident until it is dropped
(a whole shard's worth for a full scan). Reading hidden states opens the file once per chunk, so a scan keeps one
chunk resident, whatever the shard's size.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError, safe_open

from pipeline.core.stfile import TensorInfo


class LibraryRejects(ValueError):
    """The safetensors library refuses to open the file (its own message follows)."""


@dataclass(frozen=True, kw_only=True)
class LibraryHeader:
    tensors: dict[str, tuple[str, tuple[int, ...]]]  # name -> (dtype code, shape)
    metadata: dict[str, str]


def read_library_header(path: Path) -> LibraryHeader:
    """The header as safe_open parses and validates it; LibraryRejects when it refuses the file."""
    try:
        with safe_open(str(path), framework="pt") as f:
            slices = {name: f.get_slice(name) for name in f.keys()}
            tensors = {name: (s.get_dtype(), tuple(s.get_shape())) for name, s in slices.items()}
            return LibraryHeader(tensors=tensors, metadata=dict(f.metadata() or {}))
    except SafetensorError as exc:
        raise LibraryRejects(str(exc)) from exc


def header_disagreements(where: str, infos: dict[str, TensorInfo], metadata: dict[str, str],
                         library: LibraryHeader) -> list[str]:
    """Where the pipeline's parser and the library read one header differently (both accepted it)."""
    if sorted(infos) != sorted(library.tensors):
        return [f"{where}: the pipeline's parser reads tensors {sorted(infos)}, the safetensors library "
                f"{sorted(library.tensors)}"]
    problems = [f"{where}: {name} is {info.dtype_code} {list(info.shape)} to the pipeline's parser, "
                f"{library.tensors[name][0]} {list(library.tensors[name][1])} to the safetensors library"
                for name, info in sorted(infos.items()) if (info.dtype_code, info.shape) != library.tensors[name]]
    if metadata != library.metadata:
        keys = sorted(k for k in set(metadata) | set(library.metadata) if metadata.get(k) != library.metadata.get(k))
        problems.append(f"{where}: metadata {keys} read differently by the pipeline's parser and the safetensors "
                        "library")
    return problems


def read_rows(path: Path, name: str, start: int, num_rows: int) -> torch.Tensor:
    """Rows [start, start + num_rows) of a tensor, in the file's dtype. A handle of its own per call: the mapping
    (and the pages it touched) goes with the returned rows."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return f.get_slice(name)[start:start + num_rows]
    except SafetensorError as exc:
        raise LibraryRejects(str(exc)) from exc


def read_small(path: Path, *names: str) -> list[np.ndarray]:
    """Whole tensors (the [T] and [S+1] index tensors, never hidden states) as numpy copies."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return [f.get_tensor(name).numpy().copy() for name in names]
    except SafetensorError as exc:
        raise LibraryRejects(str(exc)) from exc
