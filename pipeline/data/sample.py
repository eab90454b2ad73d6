"""The prepared-sample contract shared by data preparation, engines, validation and shards."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, kw_only=True)
class PreparedSample:
    """One tokenized conversation, ready for capture.

    input_ids_T: token ids (int64, shape [T]) exactly as the chat template produced them (after the length policy).
    loss_mask_T: 1 on tokens the drafter is trained to predict (assistant turns), else 0 (uint8, shape [T]).
    """

    sample_id: str  # stable: digest of source identity and row
    source: str  # the data file name the record came from
    row: int  # 0-based record index within the source
    input_ids_T: np.ndarray
    loss_mask_T: np.ndarray
    truncated: bool = False

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids_T.shape[0])

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask_T.sum())


@dataclass(frozen=True, kw_only=True)
class Reject:
    """A record (or a captured sample) that was not written, and why."""

    source: str
    row: int
    reason: str  # a short machine-readable code, e.g. "empty", "malformed_json", "too_long"
    detail: str  # a human-readable explanation with the measured values
    sample_id: str | None = None
