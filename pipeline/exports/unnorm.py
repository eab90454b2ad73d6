"""`--last final_norm` in a layout that applies the target's final norm to its last slot itself (speculators).

Such a trainer reads its last slot x only as lm_head(RMSNorm(x)). With w the checkpoint's final-norm weight,
x = final_norm / w has mean(x^2) = 1 (final_norm = w * bN / rms(bN)), so RMSNorm(x) = w * x / sqrt(1 + eps) gives
back the engine's own final_norm to eps/2 relatively: the trainer's targets are the logits the engine computed. The
last layer's output bN itself is not recovered (only its direction is), and nothing else in the trainer reads it.
Every sample is checked as written: the trainer's norm of the stored slot against the captured final_norm.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Mapping

import torch

from pipeline.exports.slots import ExportError
from pipeline.models.checkpoint import CheckpointError, CheckpointTensors


UNNORM_BLOCK_BYTES = 4 << 20  # float32 rows of the slot worked at once (two such buffers)


class Unnorm:
    """final_norm -> final_norm / w for one run's checkpoint, with the worst round trip seen."""

    def __init__(self, checkpoint: CheckpointTensors, hidden_size: int) -> None:
        try:
            self.weight = checkpoint.norm_weight
        except CheckpointError as exc:
            raise ExportError(f"--last final_norm: {exc}") from None
        where = f"{checkpoint.path}: {checkpoint.norm_name}"
        if tuple(self.weight.shape) != (hidden_size,):
            raise ExportError(f"--last final_norm: {where} has shape {tuple(self.weight.shape)}, the run's states "
                              f"are {hidden_size} wide")
        if (zeros := int((self.weight == 0).sum())) > 0:
            raise ExportError(f"--last final_norm: {where} has {zeros} zero entries, where final_norm / w is undefined "
                              "(capture bN instead: engine=hf or engine=vllm)")
        self.checkpoint, self.where = checkpoint, where
        self.worst_rel_l2, self.checked = 0.0, 0

    @classmethod
    def of_run(cls, manifest: Mapping[str, Any], run_dir: Path) -> "Unnorm":
        """The checkpoint the run captured (its manifest's model path), which must still be there."""
        path = ((manifest.get("provenance") or {}).get("model") or {}).get("path")
        if not path or not (Path(path) / "config.json").is_file():
            raise ExportError(f"--last final_norm divides by the target's final-norm weight, read from the checkpoint "
                              f"run {run_dir} captured, but its model path {path!r} holds no config.json")
        return cls(CheckpointTensors(path), int(manifest["hidden_size"]))

    def tolerance(self, dtype: torch.dtype) -> float:
        """Storing x in the capture dtype rounds it (one ulp at most per value) and eps shifts the norm by eps/2."""
        return torch.finfo(dtype).eps + 2 * self.checkpoint.eps

    def apply(self, hidden_TPH: torch.Tensor, index: int, sample_id: str) -> torch.Tensor:
        """A copy of `hidden_TPH` whose point `index` (final_norm) is divided by w, checked through the trainer's
        norm; ExportError when the round trip is off (the states are not this checkpoint's final_norm).
        A reference export does this on every read: the other points are copied once, and the slot is worked in
        blocks of rows whose float32 buffers stay in the cache (fresh whole-sample buffers cost more in page faults
        than in arithmetic at Kimi's width)."""
        out = torch.empty_like(hidden_TPH, memory_format=torch.contiguous_format)
        out[:, :index], out[:, index + 1:] = hidden_TPH[:, :index], hidden_TPH[:, index + 1:]
        rows = max(1, UNNORM_BLOCK_BYTES // (4 * hidden_TPH.shape[-1]))
        final, x = (torch.empty(min(rows, len(out)), hidden_TPH.shape[-1], dtype=torch.float32) for _ in range(2))
        mean_square, err, ref = torch.empty(len(out), 1, dtype=torch.float32), 0.0, 0.0
        for start in range(0, len(out), rows):
            f, q, ms = final[:len(out) - start], x[:len(out) - start], mean_square[start:start + rows]
            f.copy_(hidden_TPH[start:start + rows, index])
            torch.div(f, self.weight, out=q)
            out[start:start + rows, index] = q  # rounded to the capture dtype, as stored
            q.copy_(out[start:start + rows, index])  # as the trainer reads it
            torch.linalg.vector_norm(q, dim=-1, keepdim=True, out=ms).square_().div_(q.shape[-1])
            q.mul_(torch.rsqrt(ms + self.checkpoint.eps)).mul_(self.weight).sub_(f)  # the trainer's norm - final
            err, ref = err + float(q.norm()) ** 2, ref + float(f.norm()) ** 2
        rel = (err / max(ref, torch.finfo(torch.float32).tiny)) ** 0.5
        if rel > (tol := self.tolerance(hidden_TPH.dtype)):
            raise ExportError(f"sample {sample_id}: the trainer's norm of final_norm / w is {rel:.2e} (rel L2) from "
                              f"the captured final_norm, over {tol:.1e}: the run's final_norm is not {self.where} "
                              "applied to its last layer; nothing of this sample was written")
        self._check_unit_rms(mean_square.view(-1), sample_id)
        self.worst_rel_l2 = max(self.worst_rel_l2, rel)
        self.checked += 1
        return out

    @staticmethod
    def _check_unit_rms(mean_square_T: torch.Tensor, sample_id: str) -> None:
        """Every token's x = final_norm / w has mean square ms / (ms + eps) of its residual stream, ~1: a token far
        from it (an all-zero final_norm: 0 / w = 0 passes the round trip, since the norm of 0 is 0) is no output of
        this norm on a real residual stream."""
        low, high = (float(v) for v in torch.aminmax(mean_square_T))
        if not (low < 0.5 or high > 1.5):  # NaN here is the finite check's to name
            return
        t = int(((mean_square_T < 0.5) | (mean_square_T > 1.5)).nonzero()[0])
        raise ExportError(f"sample {sample_id}: token {t}'s final_norm divided by the norm's weight has mean square "
                          f"{float(mean_square_T[t]):.3g}, where a norm's output has ~1 (an all-zero final_norm has "
                          f"0): not this checkpoint's final_norm; nothing of this sample was written")

    @property
    def digest(self) -> str:
        """sha256 of the weight in float32: what the sidecar records, and a reference export's reads check."""
        return hashlib.sha256(self.weight.numpy().tobytes()).hexdigest()

    def record(self) -> dict[str, Any]:
        """The sidecar's last_state entries for this slot."""
        return {"how": f"the run's final_norm divided by the final-norm weight ({self.where}) in float32, stored in "
                       "the capture dtype; the trainer's own norm maps it back to final_norm",
                "norm_weight_float32_sha256": self.digest, "rms_norm_eps": self.checkpoint.eps,
                "round_trip": {"samples_checked": self.checked, "worst_rel_l2": self.worst_rel_l2}}
