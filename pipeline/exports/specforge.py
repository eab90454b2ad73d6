"""SpecForge 0.2.0 offline EAGLE-3 features: one torch.save file per sample (a pickle, by SpecForge's choice).

Read from SpecForge's own source: `specforge.data.preprocessing.OfflineEagle3Dataset` and the offline data plane
(`runtime/data_plane/offline_reader.list_feature_files`, `feature_store.load_feature_file`) walk OUT for `*.ckpt`,
sort the paths lexicographically and `torch.load(path, weights_only=False, mmap=True)` each. Keys: `input_ids [T]`,
`loss_mask [T]`, `hidden_state [1, T, H]` (the target: its head is the bare lm_head, so this is the post-norm final
state, canonical final_norm) and `aux_hidden_state [1, T, 3H]` (three aux states concatenated along the hidden axis,
low to high). No shift is stored; the trainer shifts and zeroes the last loss position itself.

The pipeline only writes this format; it never reads a pickle (the tests load it in SpecForge's own environment).
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

import torch
from torch.utils.serialization import config as serialization_config

from pipeline.core.outdir import Layout
from pipeline.exports.base import ExportSample
from pipeline.exports.slots import SlotPlan, TrainerLayout
from pipeline.points import FINAL_NORM

LAYOUT = TrainerLayout(name="specforge", trainer="specforge==0.2.0", num_aux=3, last=FINAL_NORM,
                       why_last="SpecForge's target head is the bare lm_head, so its target is the post-norm state")
DATA_DIR = "data"
PER_DIR = 10_000  # files per subdirectory: a million-sample export is not a million-entry directory
_DIGITS = 10  # zero-padded so that lexicographic order is sample order up to 10^10 samples
FILES = Layout(kind="specforge", dirs={DATA_DIR: (r"\d{%d}" % (_DIGITS - 4),)})  # SpecForge lists the tree itself


@contextmanager
def _without_zip_crc32() -> Iterator[None]:
    """torch.save without the zip records' CRC32 (7x faster here: the CRC is the bulk of its cost). torch.load reads
    such files (torch.serialization.set_crc32_options says so; the tests load every file through SpecForge); a zip
    tool's integrity test would flag them. Integrity comes from the atomic rename and the verified run instead."""
    previous = serialization_config.save.compute_crc32
    serialization_config.save.compute_crc32 = False
    try:
        yield
    finally:
        serialization_config.save.compute_crc32 = previous


def _save(features: dict[str, torch.Tensor], f: BinaryIO) -> None:
    """torch.save, with a failed write (a full disk) raised as the OSError it is: torch's zip writer, closed after
    the write failed, raises a RuntimeError of its own ("unexpected pos") with the OSError only as its context."""
    try:
        torch.save(features, f)
    except RuntimeError as e:
        if isinstance(e.__context__, OSError):
            raise e.__context__ from None
        raise


class SpecForgeExporter:
    layout = LAYOUT
    files = FILES
    storage = None  # the states as captured: SpecForge reads no other

    def storage_record(self, plan: SlotPlan) -> None:
        return None

    def sample_file(self, out: Path, index: int) -> Path:
        return Path(out) / DATA_DIR / f"{index // PER_DIR:0{_DIGITS - 4}d}" / f"data_{index:0{_DIGITS}d}.ckpt"

    def write_sample(self, path: Path, sample: ExportSample, plan: SlotPlan) -> None:
        aux_TKH = sample.slots(plan.aux_index)  # fresh and contiguous: torch.save writes whole storages
        num_tokens, num_aux, hidden = aux_TKH.shape
        final_TH = sample.slots([plan.last_index])[:, 0]  # a view of a fresh [T, 1, H]: its storage is exactly T*H
        features = {"input_ids": sample.input_ids.to(torch.int64), "loss_mask": sample.loss_mask.to(torch.int64),
                    "hidden_state": final_TH.unsqueeze(0),
                    "aux_hidden_state": aux_TKH.reshape(1, num_tokens, num_aux * hidden)}
        # Through an open file, not the path: torch.save names the zip's root folder after a path's file name (here
        # the random temp name), which would make every export's bytes differ; a file object's archive is `archive/`.
        with _without_zip_crc32(), open(path, "wb") as f:
            _save(features, f)

    def finish(self, out: Path, tokens: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> list[Path]:
        return []  # SpecForge reads the directory tree itself
