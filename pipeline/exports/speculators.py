"""speculators 0.9.0 (`speculators.train.data.ArrowDataset`): an Arrow dataset plus one safetensors file per row.

Read from speculators' own source: `ArrowDataset(datapath)` calls `datasets.load_from_disk(datapath)` (a
`save_to_disk` directory saved in torch format, columns `input_ids` and `loss_mask` (int64 lists) and `seq_len`) and
reads row i's states through `hs_connectors.FileTransfer(datapath / "hidden_states")`:
`hidden_states/hs_{i}.safetensors` with `hidden_states [T, K+1, H]` and `token_ids [T]` int64 (checked equal to the
row's input_ids). The draft takes `hidden_states[:, :-1]` flattened as its K aux inputs and `hidden_states[:, -1]` as
the verifier's last hidden state, to which it applies the verifier's final norm itself: the last slot is bN. No shift
is stored (the trainer shifts).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

import pyarrow as pa
import torch

from pipeline.core.io import atomic_path, sha256_file
from pipeline.core.outdir import Layout
from pipeline.core.stfile import DTYPE_CODES, TensorSpec, header_bytes
from pipeline.exports.base import ExportSample
from pipeline.exports.slots import LAST_BOUNDARY, SlotPlan, TrainerLayout

LAYOUT = TrainerLayout(name="speculators", trainer="speculators==0.9.0", num_aux=None, last=LAST_BOUNDARY,
                       why_last="speculators applies the verifier's final norm to the last slot itself, so it must "
                                "be the last layer's output before the norm",
                       unnorms_final_norm=True)  # it reads the last slot only as lm_head(norm(x)) (eagle3/core.py)
HIDDEN_DIR = "hidden_states"
ARROW_FILE = "data-00000-of-00001.arrow"  # the names datasets' save_to_disk gives a one-file dataset
STATE_FILE = "state.json"
INFO_FILE = "dataset_info.json"
# What speculators' trainer reads: one file per sample, and the token columns as a one-file `datasets` dataset.
FILES = Layout(kind="speculators", files=(ARROW_FILE, STATE_FILE, INFO_FILE),
               dirs={HIDDEN_DIR: (r"hs_\d+\.safetensors",)})
_COLUMNS = ("input_ids", "loss_mask", "seq_len")
_SCHEMA = pa.schema([("input_ids", pa.list_(pa.int64())), ("loss_mask", pa.list_(pa.int64())),
                     ("seq_len", pa.int64())])
# datasets' own JSON for that schema (Features.to_dict): load_from_disk checks it against the Arrow schema.
_FEATURES = {"input_ids": {"feature": {"dtype": "int64", "_type": "Value"}, "_type": "List"},
             "loss_mask": {"feature": {"dtype": "int64", "_type": "Value"}, "_type": "List"},
             "seq_len": {"dtype": "int64", "_type": "Value"}}
_BATCH_ROWS = 4096  # rows per Arrow record batch: the token columns of a terabyte run never sit in memory at once


FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
SCALES_KEY = "hidden_states_scales"  # hs_connectors.fp8_utils.SCALES_KEY


def quantize_fp8(x_TKH: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """speculators' FP8 layout (hs_connectors.fp8_utils.quantize_tensor_to_fp8, 0.9.0): one float32 scale per token
    over all its slots, amax / 448 clamped at 1e-12; (float8_e4m3fn [T, K+1, H], scales [T, 1, 1])."""
    fp32 = x_TKH.float()
    scale = (fp32.abs().amax(dim=(1, 2), keepdim=True) / FP8_MAX).clamp(min=1e-12)
    return (fp32 / scale).to(torch.float8_e4m3fn), scale


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """What speculators' fp8 backend hands the trainer (hs_connectors.fp8_utils.dequantize_fp8_tensor)."""
    return q.to(dtype) * scale.to(dtype)


class SpeculatorsExporter:
    layout = LAYOUT
    files = FILES

    def __init__(self, storage: str | None = None) -> None:
        """storage: None writes the states as the run's engine captured them; "fp8" in speculators' own FP8 layout
        (read with --hidden-states-backend fp8), its rounding error measured per slot as it is written."""
        if storage not in (None, "fp8"):
            raise ValueError(f"storage {storage!r}: None or fp8")
        self.storage = storage
        self._err: torch.Tensor | None = None  # float64 [K+1]: sum of squared error, per slot
        self._ref: torch.Tensor | None = None  # float64 [K+1]: sum of squared values, per slot
        self.measured = 0

    def sample_file(self, out: Path, index: int) -> Path:
        return Path(out) / HIDDEN_DIR / f"hs_{index}.safetensors"  # the name FileTransfer.get_cached(i) opens

    def write_sample(self, path: Path, sample: ExportSample, plan: SlotPlan) -> None:
        states = sample.slots(plan.indices)
        tensors = {"hidden_states": states, "token_ids": sample.input_ids.to(torch.int64)}
        if self.storage == "fp8":
            q, scale = quantize_fp8(states)
            self._measure(states, dequantize_fp8(q, scale, states.dtype))
            tensors = {"hidden_states": q, SCALES_KEY: scale, "token_ids": tensors["token_ids"]}
        metadata = {"sample_id": sample.sample_id, "points": ",".join(p.label for p in plan.points)}
        _write_safetensors(path, tensors, metadata)

    def _measure(self, x: torch.Tensor, back: torch.Tensor) -> None:
        x64, err = x.double(), (back.double() - x.double())
        sq_err, sq_ref = err.pow(2).sum(dim=(0, 2)), x64.pow(2).sum(dim=(0, 2))
        self._err = sq_err if self._err is None else self._err + sq_err
        self._ref = sq_ref if self._ref is None else self._ref + sq_ref
        self.measured += 1

    def storage_record(self, plan: SlotPlan) -> dict | None:
        """The sidecar's `export_storage`: None for states as captured."""
        if self.storage is None:
            return None
        rel = {} if self._err is None else {
            p.label: float((self._err[i] / self._ref[i].clamp_min(1e-300)).sqrt()) for i, p in enumerate(plan.points)}
        return {"dtype": "float8_e4m3fn", "scaling": "one float32 scale per token over all slots (speculators' fp8 "
                "backend: hs_connectors.fp8_utils, 0.9.0)", "trainer_args": "--hidden-states-backend fp8",
                "rounding_rel_l2": rel, "samples_measured": self.measured,
                "measured": "what the fp8 backend hands the trainer against the run's states, per slot, aggregate "
                            "over the samples this export wrote"}

    def finish(self, out: Path, tokens: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> list[Path]:
        out = Path(out)
        arrow, state, info = out / ARROW_FILE, out / STATE_FILE, out / INFO_FILE
        if not arrow.exists():
            with atomic_path(arrow) as tmp:
                _write_arrow(tmp, tokens)
        for path, obj in ((info, {"features": _FEATURES}), (state, _state(sha256_file(arrow)[:16]))):
            if not path.exists():
                with atomic_path(path) as tmp:
                    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        return [arrow, info, state]


def _write_safetensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """The safetensors format written straight from the tensors' memory: safetensors' save_file first builds the whole
    file as bytes (about 6x slower here); the trainer reads it with the real library (tests/exports)."""
    specs = [TensorSpec(name=name, dtype_code=DTYPE_CODES[t.dtype], shape=tuple(t.shape),
                        num_bytes=t.numel() * t.element_size()) for name, t in tensors.items()]
    with open(path, "wb") as f:
        f.write(header_bytes(specs, metadata))
        for tensor in tensors.values():
            f.write(memoryview(tensor.contiguous().reshape(-1).view(torch.uint8).numpy()))


def _write_arrow(path: Path, tokens: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> None:
    with pa.OSFile(str(path), "wb") as sink, pa.RecordBatchStreamWriter(sink, _SCHEMA) as writer:
        batch: dict[str, list] = {name: [] for name in _COLUMNS}
        for input_ids, loss_mask in tokens:
            ids = input_ids.to(torch.int64).tolist()
            batch["input_ids"].append(ids)
            batch["loss_mask"].append(loss_mask.to(torch.int64).tolist())
            batch["seq_len"].append(len(ids))
            if len(batch["seq_len"]) == _BATCH_ROWS:
                writer.write_batch(pa.record_batch(batch, schema=_SCHEMA))
                batch = {name: [] for name in _COLUMNS}
        if batch["seq_len"]:
            writer.write_batch(pa.record_batch(batch, schema=_SCHEMA))


def _state(fingerprint: str) -> dict:
    """datasets' state.json for a one-file dataset in torch format (what save_to_disk after set_format writes)."""
    return {"_data_files": [{"filename": ARROW_FILE}], "_fingerprint": fingerprint, "_format_columns": None,
            "_format_kwargs": {}, "_format_type": "torch", "_output_all_columns": False, "_split": None}
