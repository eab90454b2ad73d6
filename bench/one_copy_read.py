"""bench/one_copy.py's read rounds, run with speculators' interpreter (.venv-speculators):

    .venv-speculators/bin/python bench/one_copy_read.py FULL_EXPORT REFERENCE_EXPORT REPEATS

Rounds alternate, full export then reference export, two measures:
- `sample`: every sample in order through speculators' own dataset (`ArrowDataset(...)[i]`: the per-sample read its
  trainer's data loader does, token check and slot split included) with its `FileTransfer` on the full export, then
  with the `pipeline-run` backend on the reference export; each sample's states are then summed (every value touched);
- `loader`: speculators' own training data loader over the same dataset (`_setup_dataloader`, as its train CLI builds
  it: its packing batch sampler, its collate into `total_seq_len`-token batches, the eagle3 shift; no workers, so
  the rounds run in this process): what a trainer's loader does per batch, the buffers it fills included.
The two backends must agree on the first sample. Prints one JSON line: {"full": [samples/s per round], "ref": [...],
"loader_full": [...], "loader_ref": [...]}.
"""
from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path

import torch
from hs_connectors import FileTransfer
from speculators.models.eagle3.data import shift_batch
from speculators.train.data import ArrowDataset
from speculators.train.dataloader import _setup_dataloader

from pipeline.exports.run_states import RunStates
from pipeline.trainers.speculators_backend import RunTransfer

TOTAL_SEQ_LEN = 8192  # speculators' train CLI default (--total-seq-len)


def rate(dataset: ArrowDataset, num: int) -> float:
    start = time.perf_counter()
    for i in range(num):
        sample = dataset[i]
        for key in ("hidden_states", "verifier_last_hidden_states"):
            sample[key].sum(dtype=torch.float32)
    return num / (time.perf_counter() - start)


def loader_rate(loader, num: int) -> float:
    start = time.perf_counter()
    for _ in loader:
        pass
    return num / (time.perf_counter() - start)


def dataset(export: Path, transfer) -> ArrowDataset:
    return ArrowDataset(max_len=1 << 20, datapath=str(export), transfer=transfer, on_missing="raise", train_ratio=1.0)


def loader(export: Path, transfer, hidden_size: int, slots: int):
    data = ArrowDataset(max_len=TOTAL_SEQ_LEN, datapath=str(export), transfer=transfer, on_missing="raise",
                        train_ratio=1.0)
    return _setup_dataloader(data, TOTAL_SEQ_LEN, hidden_size, num_workers=0, num_target_layers=slots - 1,
                             preprocess=shift_batch)


def main() -> None:
    warnings.filterwarnings("ignore", message=".*pin_memory.*")  # no accelerator here: nothing to pin
    full, ref, repeats = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    sidecar = json.loads((ref / "export.json").read_text())
    num, hidden, slots = sidecar["num_samples"], int(sidecar["hidden_size"]), len(sidecar["slots"])
    states = RunStates(ref)
    states.check()
    transfers = {"full": FileTransfer(full / "hidden_states"), "ref": RunTransfer(states)}
    exports = {"full": full, "ref": ref}
    datasets = {name: dataset(exports[name], t) for name, t in transfers.items()}
    loaders = {name: loader(exports[name], t, hidden, slots) for name, t in transfers.items()}
    a, b = (d[0]["hidden_states"] for d in datasets.values())
    if not torch.equal(a.view(torch.int16), b.view(torch.int16)):
        raise SystemExit("the two paths disagree on sample 0")
    out = {name: [] for name in (*datasets, *(f"loader_{n}" for n in loaders))}
    for _ in range(repeats):
        for name, data in datasets.items():
            out[name].append(rate(data, num))
        for name, batches in loaders.items():
            out[f"loader_{name}"].append(loader_rate(batches, num))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
