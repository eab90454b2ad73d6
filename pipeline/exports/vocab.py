"""`--draft-vocab N`: the draft vocabulary files speculators 0.9's trainer reads, as its own data preparation writes
them, so its CLI writes nothing into the export.

Read from speculators' source (speculators/train/vocab_mapping.py and train/cli.py):
- `token_freq.pt`: `save_token_frequency_distribution` counts, sample by sample in dataset order, the target tokens
  whose loss_mask is 1 (`input_ids[loss_mask.bool()].unique(return_counts=True)` into a Counter) and torch.saves the
  plain dict {token id: count}; the CLI loads it with `torch.load(weights_only=True)`.
- `d2t-{N}.npy` / `t2d-{N}.npy`: `build_vocab_mappings_from_distribution` sorts the ids by (-count, id), keeps the N
  first (padded with the lowest unused ids when fewer than N were seen), sorts them; d2t = ids - arange(N) (int64
  offsets: target id = draft id + d2t), t2d = a bool mask over the target vocabulary; the CLI caches them with
  np.save under these names in its data path and reads them with np.load (`--d2t-path/--t2d-path`, or found there).
This module reproduces both functions (the pipeline's environment does not import speculators); tests/exports runs
speculators' own functions and loader on an export and checks they give the same files.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Iterable

import numpy as np
import torch

from pipeline.core.io import atomic_path, sha256_file
from pipeline.core.jsonfile import read_object
from pipeline.exports.slots import ExportError
from pipeline.models.info import text_config

TOKEN_FREQ = "token_freq.pt"  # the name speculators' CLI looks for in its data path


def names(draft_vocab: int) -> tuple[str, str, str]:
    return TOKEN_FREQ, f"d2t-{draft_vocab}.npy", f"t2d-{draft_vocab}.npy"


def frequencies(tokens: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> dict[int, int]:
    """Counts of the trained (loss-masked) target tokens, in speculators' insertion order."""
    counts: Counter[int] = Counter()
    for input_ids, loss_mask in tokens:
        ids, n = input_ids.to(torch.int64)[loss_mask.to(torch.bool)].unique(return_counts=True)
        counts.update(dict(zip(ids.tolist(), n.tolist(), strict=True)))
    return dict(counts)


def mappings(freq: dict[int, int], draft_vocab: int, target_vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t int64 offsets [N], t2d bool [V]) for the N most frequent tokens, ties to the lower id."""
    ranked = sorted(freq, key=lambda tid: (-freq[tid], tid))
    chosen = ranked[:draft_vocab]
    if len(chosen) < draft_vocab:  # fewer distinct tokens trained than N: the lowest unused ids fill the rest
        seen = set(chosen)
        chosen += [t for t in range(draft_vocab) if t not in seen][:draft_vocab - len(chosen)]
    chosen.sort()
    d2t = torch.tensor(chosen, dtype=torch.long) - torch.arange(draft_vocab, dtype=torch.long)
    t2d = torch.zeros(target_vocab, dtype=torch.bool)
    t2d[chosen] = True
    return d2t, t2d


def target_vocab_size(manifest: dict, run_dir: Path) -> int:
    """The target's vocabulary (t2d's length): the run's model directory config.json (provenance does not hold it)."""
    path = ((manifest.get("provenance") or {}).get("model") or {}).get("path")
    config = Path(str(path)) / "config.json" if path else None
    if config is None or not config.is_file():
        raise ExportError(f"--draft-vocab needs the target's vocabulary size, read from the run's model directory, "
                          f"but {config or 'no model path'} (run {run_dir}) is not there")
    vocab = text_config(read_object(config, ExportError)).get("vocab_size")
    if not isinstance(vocab, int) or vocab < 1:
        raise ExportError(f"{config}: vocab_size must be a positive integer, got {vocab!r}")
    return vocab


def check_size(draft_vocab: int, target_vocab: int) -> None:
    if not 1 <= draft_vocab <= target_vocab:
        raise ExportError(f"--draft-vocab {draft_vocab}: must be between 1 and the target's vocabulary "
                          f"{target_vocab}")


def write(out: Path, tokens: Iterable[tuple[torch.Tensor, torch.Tensor]], draft_vocab: int,
          target_vocab: int, *, named: str) -> dict:
    """Write the three files (each atomically, skipped when a resumed export already has it); the sidecar's record,
    whose trainer arguments name the files in `named`, the export as a trainer names it (`ExportOut.trainer_name`)."""
    out = Path(out)
    freq = frequencies(tokens)
    d2t, t2d = mappings(freq, draft_vocab, target_vocab)
    freq_name, d2t_name, t2d_name = names(draft_vocab)
    for name, save in ((freq_name, lambda f: torch.save(freq, f)), (d2t_name, lambda f: np.save(f, d2t.numpy())),
                       (t2d_name, lambda f: np.save(f, t2d.numpy()))):
        if not (out / name).exists():
            with atomic_path(out / name) as tmp, open(tmp, "wb") as f:  # an open file: no temp name in the archive
                save(f)
    return {"draft_vocab_size": draft_vocab, "target_vocab_size": target_vocab,
            "counted": "input_ids where loss_mask is 1 (speculators' save_token_frequency_distribution)",
            "trained_tokens": sum(freq.values()), "distinct_trained_tokens": len(freq),
            "covered_trained_tokens": sum(freq.get(t, 0) for t in (torch.arange(draft_vocab) + d2t).tolist()),
            "files": {role: {"path": name, "sha256": sha256_file(out / name)}
                      for role, name in (("token_freq", freq_name), ("d2t", d2t_name), ("t2d", t2d_name))},
            "trainer_args": f"--draft-vocab-size {draft_vocab} --d2t-path {named}/{d2t_name} "
                            f"--t2d-path {named}/{t2d_name}"}
