"""speculators' own training CLI on an export of ours, as its users run it (on CPU through the device-only shim in
tests/exports/drivers/speculators_cpu.py): the command line, built once for the tests and bench/closed_loop.py.

The draft vocabulary comes from the export's own files through the flags its sidecar prints (the trainer then writes
nothing into the export), the aux ids from the sidecar's vLLM serving ids, and the flags a CPU needs are always
given: float32 hidden states (bf16 is emulated on CPUs without AMX), SDPA attention, the eager loss (no Triton), no
hidden-state generation for missing samples (the default calls a vLLM endpoint).
"""
from __future__ import annotations

import json
import shlex
from pathlib import Path

from tests.helpers import REPO

__all__ = ["SPECULATORS_PYTHON", "SPECULATORS_SHIM", "speculators_train"]

SPECULATORS_PYTHON = REPO / ".venv-speculators" / "bin" / "python"
SPECULATORS_SHIM = REPO / "tests" / "exports" / "drivers" / "speculators_cpu.py"


def speculators_train(verifier: Path, export: Path | str, save: Path, *, epochs: int, total_seq_len: int, lr: float,
                      ttt_steps: int = 3, num_workers: int = 0, log_dir: Path | None = None,
                      extra: tuple[str, ...] = ()) -> list[str]:
    """argv of one training run: one draft layer on `export` (a directory, or an s3:// URL), checkpoints under
    `save/<epoch>`."""
    if isinstance(export, str):
        from pipeline.core.stores import open_store

        sidecar = json.loads(open_store(export).get("export.json"))
    else:
        sidecar = json.loads((export / "export.json").read_text())
    return [str(SPECULATORS_PYTHON), str(SPECULATORS_SHIM), "--verifier-name-or-path", str(verifier),
            "--data-path", str(export), "--save-path", str(save), "--num-layers", "1",
            "--target-layer-ids", *map(str, sidecar["serving"]["vllm"]["aux_layer_ids"]),
            *shlex.split(sidecar["draft_vocab"]["trainer_args"]),
            "--hidden-states-dtype", "float32", "--draft-attn-impl", "sdpa", "--loss-implementation", "eager",
            "--num-workers", str(num_workers), "--on-missing", "raise", "--epochs", str(epochs),
            "--total-seq-len", str(total_seq_len), "--ttt-steps", str(ttt_steps), "--lr", str(lr),
            "--log-dir", str(log_dir or save.parent / "train-logs"), *extra]
