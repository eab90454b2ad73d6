"""A shard's safetensors file in a store (an object in a bucket), read by ranges with the interface of the safetensors
library's `safe_open` handle that `RunReader` uses: `metadata()` and `get_slice(name)[rows]` /
`get_slice(name)[rows, points]`. The header is read once (two requests); a slice of rows is one request for exactly
their bytes (rows are contiguous in every tensor of a shard), so reading a sample holds that sample, never the shard."""
from __future__ import annotations

import math
from typing import Any

import torch

from pipeline.core.stfile import CODE_DTYPES, TensorInfo, read_header_ranged
from pipeline.core.storage import Store


class RangedShard:
    def __init__(self, store: Store, key: str, size: int) -> None:
        self.store, self.key = store, key
        self.where = f"{store.url}/{key}"
        self.infos, self._metadata = read_header_ranged(lambda a, b: store.get(key, a, b), size, self.where)
        for name, info in self.infos.items():
            if info.dtype_code not in CODE_DTYPES:
                raise ValueError(f"{self.where}: tensor {name} has dtype {info.dtype_code!r}, none a run stores")
            if info.end > size or info.start > info.end:
                raise ValueError(f"{self.where}: tensor {name} lies outside the file's {size} bytes")
            need = math.prod(info.shape) * CODE_DTYPES[info.dtype_code].itemsize
            if info.end - info.start != need:
                raise ValueError(f"{self.where}: tensor {name} spans {info.end - info.start} bytes, its shape "
                                 f"{list(info.shape)} needs {need}")
        self.bytes_read = 0  # of tensor data, for the tests and the bench

    def metadata(self) -> dict[str, str]:
        return self._metadata

    def get_slice(self, name: str) -> "RangedSlice":
        if name not in self.infos:
            raise KeyError(f"{self.where}: no tensor {name!r}")
        return RangedSlice(self, name, self.infos[name])


class RangedSlice:
    def __init__(self, shard: RangedShard, name: str, info: TensorInfo) -> None:
        self.shard, self.name, self.info = shard, name, info
        self.dtype = CODE_DTYPES[info.dtype_code]

    def get_shape(self) -> list[int]:
        return list(self.info.shape)

    def __getitem__(self, index: Any) -> torch.Tensor:
        """Rows `index` (a step-1 slice), or `[rows, rest...]`: the rows read in one request, then indexed."""
        rows, rest = (index[0], index[1:]) if isinstance(index, tuple) else (index, ())
        shape = self.info.shape
        if not isinstance(rows, slice) or not shape:
            raise TypeError(f"{self.shard.where}: {self.name} is read by a slice of rows, not {index!r}")
        start, stop, step = rows.indices(shape[0])
        if step != 1:
            raise TypeError(f"{self.shard.where}: {self.name}: rows are read with step 1, not {step}")
        stop = max(start, stop)
        row_bytes = math.prod(shape[1:]) * self.dtype.itemsize
        begin = self.info.start + start * row_bytes
        data = self.shard.store.get(self.shard.key, begin, begin + (stop - start) * row_bytes) if stop > start \
            else b""
        if len(data) != (stop - start) * row_bytes:
            raise ValueError(f"{self.shard.where}: {self.name} rows {start}:{stop}: read {len(data)} bytes, expected "
                             f"{(stop - start) * row_bytes} (the object is shorter than its header says)")
        self.shard.bytes_read += len(data)
        flat = torch.frombuffer(bytearray(data), dtype=self.dtype) if data else torch.empty(0, dtype=self.dtype)
        tensor = flat.reshape(stop - start, *shape[1:])
        return tensor[(slice(None), *rest)].contiguous() if rest else tensor
