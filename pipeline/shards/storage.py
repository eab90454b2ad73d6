"""How a shard stores hidden states: as captured, or in float8_e4m3fn with one float32 scale per (token, point) row.

`runner.storage_dtype=float8_e4m3fn` halves the bytes of hidden states on disk. Each row `x` (one token at one point,
H values) is stored as `q = fp8(x / s)` with `s = max|x| / 448` (448 = e4m3fn's largest value) and read back as
`(q * s).to(capture dtype)`. Why per row and not per tensor (bench/fp8_storage.py, measured on real captures of the
tiny models): e4m3 is a float, so its relative precision (3 mantissa bits) is the same wherever a value lands in its
normal range, and on well-scaled states every scaling gives the same ~2.6% relative L2; a scale only decides which
values overflow (beyond 448: clipped) or sink below the normal range (under 2^-6: subnormal, then zero). A real
checkpoint's residual stream spans orders of magnitude across tokens (embeddings near 1e-2, attention-sink tokens
with "massive activations" of 1e3 or more), and one scale per tensor puts the ordinary tokens of a sample with a
sink token into the subnormals; one scale per row cannot clip, and only a row's own values share its range. A
float32 scale costs 4 bytes per H: 0.51x of bf16 at H=256, 0.5003x at Kimi's 7168.

The scales are a tensor of their own, `hidden_scales [T, P] F32`, after `hidden_states` in the file (the states are
streamed sample by sample and every sample's scales are known only once it is encoded). The writer measures the
rounding error (relative L2 of the dequantized states against what the engine captured, per point, on every 4th
token) while it encodes; the shard's entry keeps the sums, so the run's figure covers all shards.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping, Sequence

import torch

from pipeline.core.stfile import TensorSpec
from pipeline.shards import layout

FP8 = "float8_e4m3fn"
NO_SCALING = "none"
ROW_SCALING = "absmax_per_token_point"  # s = max|x| / 448 over the hidden axis, one float32 per (token, point)
SCALE_DTYPE = torch.float32
_FP8_MAX = torch.finfo(torch.float8_e4m3fn).max
# The rounding error is measured on every 4th token of each block (the first included): converting fp8 back is the
# slowest step on a CPU, and a quarter of a run's tokens pins the figure to well under 1% of itself.
ROUNDING_STRIDE = 4
_BLOCK_VALUES = 1 << 24  # values encoded per block: float32 temporaries of 64 MiB whatever a sample's length (smaller
# blocks cost more in per-op overhead than they save)


@dataclass(frozen=True, kw_only=True)
class Storage:
    """What a shard's hidden states are on disk (`dtype`), what the engine captured and the reader returns
    (`capture_dtype`), and how one becomes the other (`scaling`)."""

    dtype: str
    capture_dtype: str
    scaling: str

    @property
    def scaled(self) -> bool:
        return self.scaling == ROW_SCALING

    @property
    def tensor_names(self) -> tuple[str, ...]:
        """The shard's tensors, in file order."""
        hidden = (layout.HIDDEN_STATES, layout.HIDDEN_SCALES) if self.scaled else (layout.HIDDEN_STATES,)
        return (layout.INPUT_IDS, layout.SAMPLE_OFFSETS, *hidden, layout.LOSS_MASK)

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    def metadata(self) -> str:
        """The shard metadata value under layout.META_STORAGE."""
        return json.dumps(self.to_dict(), sort_keys=True)

    def hidden_specs(self, num_tokens: int, num_points: int, hidden_size: int) -> list[TensorSpec]:
        code = layout.HIDDEN_DTYPES[self.dtype][1]
        item = itemsize(layout.HIDDEN_DTYPES[self.dtype][0])
        specs = [TensorSpec(name=layout.HIDDEN_STATES, dtype_code=code, shape=(num_tokens, num_points, hidden_size),
                            num_bytes=num_tokens * num_points * hidden_size * item)]
        if self.scaled:
            specs.append(TensorSpec(name=layout.HIDDEN_SCALES, dtype_code="F32", shape=(num_tokens, num_points),
                                    num_bytes=num_tokens * num_points * itemsize(SCALE_DTYPE)))
        return specs

    def decode(self, stored_TPH: torch.Tensor, scales_TP: torch.Tensor | None = None) -> torch.Tensor:
        """What the reader returns: the states in the capture dtype."""
        capture = layout.HIDDEN_DTYPES[self.capture_dtype][0]
        if not self.scaled:
            return stored_TPH.to(capture)
        if scales_TP is None:
            raise ValueError(f"{self.dtype} states need their {layout.HIDDEN_SCALES}")
        return (stored_TPH.float() * scales_TP.float().unsqueeze(-1)).to(capture)

    def encode(self, x_TPH: torch.Tensor, sums: tuple[torch.Tensor, torch.Tensor] | None = None,
               stride: int = ROUNDING_STRIDE) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(stored states, scales or None) of one sample's states, block by block; with `sums` (float64 [P] each),
        the rounding error's (sum of squared error, sum of squared values) per point over every `stride`-th token
        is added to them."""
        if not self.scaled:
            return x_TPH, None
        stored = torch.empty(x_TPH.shape, dtype=torch.float8_e4m3fn)
        scales = torch.empty(x_TPH.shape[:2], dtype=SCALE_DTYPE)
        for rows in _blocks(x_TPH):
            block = x_TPH[rows]
            amax = block.abs().amax(dim=-1).to(SCALE_DTYPE)  # exact in the capture dtype
            # an all-zero row gets scale 1 (stored as zeros); a row with NaN or inf gets a non-finite scale, which the
            # writer refuses
            scale = torch.where(amax == 0, torch.ones_like(amax), amax / _FP8_MAX)
            scaled = block.to(SCALE_DTYPE).mul_(scale.reciprocal().unsqueeze(-1))  # |x / s| <= 448: nothing clips
            stored[rows] = q = scaled.to(torch.float8_e4m3fn)
            scales[rows] = scale
            if sums is not None:
                every = slice(None, None, stride)
                _add_rounding(sums, q[every], scaled[every], scale[every])
        return stored, scales


def _add_rounding(sums: tuple[torch.Tensor, torch.Tensor], q: torch.Tensor, scaled: torch.Tensor,
                  scale: torch.Tensor) -> None:
    """Per point: sum over rows of s^2 * ||q - x/s||^2 and of s^2 * ||x/s||^2, i.e. the squared error of the
    dequantized states (before a reader's cast to the capture dtype, which adds at most 2^-9 relative) and the
    squared captured values. One fused norm per row instead of materialising the dequantized block."""
    s2 = scale.double().pow(2)
    err = torch.linalg.vector_norm(q.to(SCALE_DTYPE).sub_(scaled), dim=-1).double().pow(2)
    ref = torch.linalg.vector_norm(scaled, dim=-1).double().pow(2)
    sums[0].add_((err * s2).sum(dim=0))
    sums[1].add_((ref * s2).sum(dim=0))


def itemsize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def _blocks(x_TPH: torch.Tensor) -> list[slice]:
    num_tokens = int(x_TPH.shape[0])
    per_row = max(1, math.prod(x_TPH.shape[1:]))
    step = max(1, _BLOCK_VALUES // per_row)
    return [slice(a, min(a + step, num_tokens)) for a in range(0, num_tokens, step)]


def choose(capture_dtype: torch.dtype, storage_dtype: str | None) -> Storage:
    """The storage of states captured in `capture_dtype` for `runner.storage_dtype` (None: as captured)."""
    capture = layout.dtype_name(capture_dtype)
    if capture == FP8:
        raise ValueError(f"hidden states captured in {FP8} have no scales; capture in a wider dtype")
    if storage_dtype is None or storage_dtype == capture:
        return Storage(dtype=capture, capture_dtype=capture, scaling=NO_SCALING)
    if storage_dtype == FP8:
        return Storage(dtype=FP8, capture_dtype=capture, scaling=ROW_SCALING)
    raise ValueError(f"storage_dtype={storage_dtype!r} is not supported; choose null (the capture dtype) or {FP8!r}")


def parse(record: Any) -> Storage:
    """A Storage from its record (shard metadata, manifest, shard entry); ValueError names what is inconsistent."""
    if not isinstance(record, Mapping):
        raise ValueError(f"storage record {record!r} is not an object")
    try:
        storage = Storage(dtype=record["dtype"], capture_dtype=record["capture_dtype"], scaling=record["scaling"])
    except KeyError as e:
        raise ValueError(f"storage record {dict(record)} has no {e.args[0]!r}") from None
    for key in ("dtype", "capture_dtype"):
        if getattr(storage, key) not in layout.HIDDEN_DTYPES:
            raise ValueError(f"storage {key}={getattr(storage, key)!r} is not one of {', '.join(layout.HIDDEN_DTYPES)}")
    plain = storage.scaling == NO_SCALING and storage.dtype == storage.capture_dtype != FP8
    fp8 = storage.scaling == ROW_SCALING and storage.dtype == FP8 and storage.capture_dtype != FP8
    if not (plain or fp8):
        raise ValueError(f"storage dtype={storage.dtype!r} with scaling={storage.scaling!r} from capture dtype "
                         f"{storage.capture_dtype!r} is not a storage this pipeline writes (the capture dtype "
                         f"with scaling {NO_SCALING!r}, or {FP8} with scaling {ROW_SCALING!r})")
    return storage


def of_manifest(manifest: Mapping[str, Any]) -> Storage:
    """The run's storage from its manifest (as pipeline.shards.manifest.read_manifest gives it: every version's
    manifest carries the record)."""
    return parse(manifest.get("storage"))


class ShardEncoder:
    """Encodes a shard's states sample by sample for the writer, measuring the rounding error as it goes.

    `chunks(hs)` gives the bytes to write now for one sample's hidden_states; `trailing()` the tensors that follow
    hidden_states in the file (the scales); `record()` the shard entry's storage record with the error sums.
    """

    def __init__(self, storage: Storage, num_points: int) -> None:
        self.storage = storage
        self._scales: list[torch.Tensor] = []
        self._sq_err = torch.zeros(num_points, dtype=torch.float64)
        self._sq_ref = torch.zeros(num_points, dtype=torch.float64)

    def chunks(self, x_TPH: torch.Tensor, sample_id: str) -> Iterable[torch.Tensor]:
        stored, scales = self.storage.encode(x_TPH, (self._sq_err, self._sq_ref))
        if scales is None:
            return [stored]
        if not bool(torch.isfinite(scales).all()):
            raise ValueError(f"sample {sample_id}: non-finite hidden states cannot be stored in {self.storage.dtype}")
        self._scales.append(scales)
        return [stored]

    def trailing(self) -> list[torch.Tensor]:
        return list(self._scales)

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = self.storage.to_dict()
        if self.storage.scaled:
            out["sq_err"] = [float(v) for v in self._sq_err]
            out["sq_ref"] = [float(v) for v in self._sq_ref]
        return out


def rounding_rel_l2(x_TPH: torch.Tensor, storage: Storage) -> list[float]:
    """Relative L2 per point of the stored-and-dequantized states against `x_TPH` (0 for storage as captured): the
    figure the diff report shows beside the cross-engine divergence."""
    num_points = int(x_TPH.shape[1])
    sums = (torch.zeros(num_points, dtype=torch.float64), torch.zeros(num_points, dtype=torch.float64))
    storage.encode(x_TPH, sums, stride=1)  # a probe is small: every token
    return _ratios(*sums) if storage.scaled else [0.0] * num_points


def _ratios(err: Sequence[float] | torch.Tensor, ref: Sequence[float] | torch.Tensor) -> list[float]:
    return [math.sqrt(e / r) if r > 0 else 0.0 for e, r in zip((float(v) for v in err), (float(v) for v in ref))]


def run_record(records: Sequence[Mapping[str, Any]], points: Sequence[str], *, hidden_size: int, num_tokens: int,
               shard_bytes: int) -> dict[str, Any] | None:
    """The manifest's `storage` record from the shard entries' storage records: the storage, the rounding error per
    point over the whole run, and bytes per token (hidden states as stored and as captured; the shard files on disk).
    None for a run without shards."""
    if not records:
        return None
    storage = parse(records[0])
    if storage.scaled:
        err = [sum(r["sq_err"][i] for r in records) for i in range(len(points))]
        ref = [sum(r["sq_ref"][i] for r in records) for i in range(len(points))]
        rel = _ratios(err, ref)
    else:
        rel = [0.0] * len(points)
    row = hidden_size * itemsize(layout.HIDDEN_DTYPES[storage.dtype][0])
    row += itemsize(SCALE_DTYPE) if storage.scaled else 0
    return {**storage.to_dict(), "rounding_rel_l2": dict(zip(points, rel)),
            "hidden_bytes_per_token": row * len(points),
            "capture_hidden_bytes_per_token": hidden_size * len(points) * itemsize(
                layout.HIDDEN_DTYPES[storage.capture_dtype][0]),
            "shard_bytes_per_token": shard_bytes / num_tokens if num_tokens else 0.0}
