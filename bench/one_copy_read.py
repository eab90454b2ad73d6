"""bench/one_copy.py's read rounds, run with speculators' interpreter (.venv-speculators):

    .venv-speculators/bin/python bench/one_copy_read.py FULL_EXPORT REFERENCE_EXPORT REPEATS

Rounds alternate: every sample in order through speculators' own `FileTransfer.get_cached(i)` on the full export,
then through the `pipeline-run` backend's on the reference export; each round checks the two agree on the first
sample. Prints one JSON line: {"full": [samples/s per round], "ref": [...]}.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from hs_connectors import FileTransfer

from pipeline.exports.run_states import RunStates
from pipeline.trainers.speculators_backend import RunTransfer


def rate(transfer, num: int) -> float:
    start = time.perf_counter()
    for i in range(num):
        sample = transfer.get_cached(i)
        sample["hidden_states"].float().sum()  # touch every value, as a trainer's batch does
    return num / (time.perf_counter() - start)


def main() -> None:
    full, ref, repeats = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    num = json.loads((ref / "export.json").read_text())["num_samples"]
    states = RunStates(ref)
    states.check()
    transfers = {"full": FileTransfer(full / "hidden_states"), "ref": RunTransfer(states)}
    a, b = (t.get_cached(0)["hidden_states"] for t in transfers.values())
    if not torch.equal(a.view(torch.int16), b.view(torch.int16)):
        raise SystemExit("the two paths disagree on sample 0")
    out = {name: [] for name in transfers}
    for _ in range(repeats):
        for name, transfer in transfers.items():
            out[name].append(rate(transfer, num))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
