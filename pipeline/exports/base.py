"""One exported sample and the small contract every trainer layout implements (speculators.py, specforge.py)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Protocol

import torch

from pipeline.core.outdir import Layout
from pipeline.exports.slots import SlotPlan, TrainerLayout


@dataclass(frozen=True, kw_only=True)
class ExportSample:
    """A run's sample as the driver hands it to a layout: its rows of the run's hidden states, not yet selected."""

    index: int  # position in the run's storage order = position in the trainer's read order
    sample_id: str
    input_ids: torch.Tensor  # [T] int64
    loss_mask: torch.Tensor  # [T] uint8 (the run's storage dtype)
    hidden_TPH: torch.Tensor  # [T, P, H] every captured point, the capture dtype (fp8 storage dequantized)

    def slots(self, indices: Iterable[int]) -> torch.Tensor:
        """[T, len(indices), H]: a fresh contiguous tensor holding only the selected points, in the given order."""
        return self.hidden_TPH.index_select(1, torch.tensor(list(indices), dtype=torch.long))


class Exporter(Protocol):
    """A trainer layout: where sample i lives, how it is written, and what the trainer reads besides the samples."""

    layout: TrainerLayout
    files: Layout  # what it writes into OUT (the export adds its sidecar and plan: pipeline.exports.sidecar)
    storage: str | None  # None: the states as the run's engine captured them; "fp8": the trainer's own FP8 layout

    def sample_file(self, out: Path, index: int) -> Path:
        """The file holding sample `index`; names sort (as the trainer reads them) in the run's sample order."""

    def write_sample(self, path: Path, sample: ExportSample, plan: SlotPlan) -> None:
        """Write one sample to `path` (a temp file the driver renames once it is complete)."""

    def storage_record(self, plan: SlotPlan) -> dict | None:
        """What the states were written as, when not as captured (dtype, scaling, rounding error per slot)."""

    def finish(self, out: Path, tokens: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> list[Path]:
        """Write what the trainer reads besides the per-sample files (every (input_ids, loss_mask) in order); returns
        the paths written. Each file is written atomically and skipped when it already exists."""
