"""`pipeline.export --draft-vocab N`: the draft vocabulary files speculators' own data preparation would write, read by
its own training CLI's loader in its own environment (which then writes nothing into the export), equal to what its
own functions build, and agreeing with the trained-token frequencies counted here from the run itself."""
from __future__ import annotations

import hashlib
import json
from collections import Counter

import pytest
import torch

from pipeline.shards.reader import RunReader
from tests.exports.conftest import cli, read_all, trainer

pytestmark = pytest.mark.integration
N = 48


def _trained_counts(run) -> Counter:
    counts: Counter = Counter()
    with RunReader(run) as reader:
        for sample in reader.iter_samples():
            counts.update(sample["input_ids"][sample["loss_mask"].bool()].tolist())
    return counts


def test_the_vocabulary_files_are_read_by_speculators_own_loader(llama_run, models_root, tmp_path):
    out = tmp_path / "export"
    proc = cli("pipeline.export", str(llama_run), "--format", "speculators", "--out", str(out), "--draft-vocab", str(N))
    assert proc.returncode == 0, proc.stderr
    sidecar = json.loads((out / "export.json").read_text())["draft_vocab"]
    for role, name in (("token_freq", "token_freq.pt"), ("d2t", f"d2t-{N}.npy"), ("t2d", f"t2d-{N}.npy")):
        assert sidecar["files"][role]["path"] == name
        assert sidecar["files"][role]["sha256"] == hashlib.sha256((out / name).read_bytes()).hexdigest()
    assert f"--d2t-path {out.resolve() / f'd2t-{N}.npy'}" in sidecar["trainer_args"]
    again = cli("pipeline.export", str(llama_run), "--format", "speculators", "--out", str(out), "--draft-vocab", str(N))
    assert again.returncode == 0 and "already complete" in again.stdout, again.stderr  # its sidecar read as its plan
    other = cli("pipeline.export", str(llama_run), "--format", "speculators", "--out", str(out), "--draft-vocab", "32")
    assert other.returncode == 2 and f"draft_vocab ({N} then, 32 now)" in other.stderr, other.stderr
    result, loaded = trainer("speculators", "vocab", out, tmp_path / "result", str(models_root / "tiny-llama"), str(N))
    # speculators' CLI loads them (given the paths, and finding them in its data path), its own functions build the
    # same files from the export's frequencies and count the same frequencies over the export's dataset, and it
    # wrote nothing into the export
    assert result["size"] == result["found_size"] == N and result["found_equal"] and result["rebuilt_equal"], result
    assert result["d2t_dtype"] == "torch.int64" and result["t2d_dtype"] == "torch.bool", result
    assert result["own_freq_equal"] and result["own_freq_same_order"] and result["freq_types"] == ["int:int"], result
    assert result["listing_unchanged"], result
    # and they agree with the loss-masked tokens of the run, counted here
    counts = _trained_counts(llama_run)
    got = read_all(loaded)
    assert dict(zip(got["freq_ids"].tolist(), got["freq_counts"].tolist())) == dict(counts)
    top = sorted(sorted(counts, key=lambda t: (-counts[t], t))[:N])
    if len(top) < N:  # fewer distinct trained tokens than N: speculators fills with the lowest unused ids
        top = sorted(top + [t for t in range(N) if t not in set(top)][:N - len(top)])
    assert (got["d2t"] + torch.arange(N)).tolist() == top
    assert got["t2d"].nonzero().flatten().tolist() == top and got["t2d"].shape[0] == sidecar["target_vocab_size"]
    assert sidecar["trained_tokens"] == sum(counts.values()) and sidecar["distinct_trained_tokens"] == len(counts)
    assert sidecar["covered_trained_tokens"] == sum(counts[t] for t in top)


def test_draft_vocab_refusals_are_one_line(llama_run, tmp_path):
    for fmt, n, needle in (("specforge", "32", "the specforge layout does not read them"),
                           ("speculators", "0", "--draft-vocab 0: must be between 1 and the target's vocabulary")):
        proc = cli("pipeline.export", str(llama_run), "--format", fmt, "--out", str(tmp_path / fmt), "--draft-vocab", n)
        assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
        assert not (tmp_path / fmt).exists()
