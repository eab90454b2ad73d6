"""bench/one_copy.py's read rounds, run with speculators' interpreter (.venv-speculators):

    .venv-speculators/bin/python bench/one_copy_read.py FULL_EXPORT REFERENCE_EXPORT REPEATS

Rounds alternate: every sample in order through speculators' own dataset (`ArrowDataset(...)[i]`: the per-sample
read its trainer's data loader does, token check and slot split included) with its `FileTransfer` on the full
export, then with the `pipeline-run` backend on the reference export; each sample's states are then summed (a
trainer touches every value). The two must agree on the first sample. Prints one JSON line:
{"full": [samples/s per round], "ref": [...]}.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from hs_connectors import FileTransfer
from speculators.train.data import ArrowDataset

from pipeline.exports.run_states import RunStates
from pipeline.trainers.speculators_backend import RunTransfer


def rate(dataset: ArrowDataset, num: int) -> float:
    start = time.perf_counter()
    for i in range(num):
        sample = dataset[i]
        sample["hidden_states"].sum(dtype=torch.float32) + sample["verifier_last_hidden_states"].sum(dtype=torch.float32)
    return num / (time.perf_counter() - start)


def dataset(export: Path, transfer) -> ArrowDataset:
    return ArrowDataset(max_len=1 << 20, datapath=str(export), transfer=transfer, on_missing="raise", train_ratio=1.0)


def main() -> None:
    full, ref, repeats = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    num = json.loads((ref / "export.json").read_text())["num_samples"]
    states = RunStates(ref)
    states.check()
    datasets = {"full": dataset(full, FileTransfer(full / "hidden_states")), "ref": dataset(ref, RunTransfer(states))}
    a, b = (d[0]["hidden_states"] for d in datasets.values())
    if not torch.equal(a.view(torch.int16), b.view(torch.int16)):
        raise SystemExit("the two paths disagree on sample 0")
    out = {name: [] for name in datasets}
    for _ in range(repeats):
        for name, data in datasets.items():
            out[name].append(rate(data, num))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
