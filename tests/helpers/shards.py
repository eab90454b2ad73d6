"""Synthetic samples and captures for the shard tests, and whole run directories written the way extract writes them."""
from __future__ import annotations

import zlib

import numpy as np
import torch

from pipeline.core.contracts import Capture, PreparedSample
from pipeline.shards import layout
from pipeline.shards.manifest import write_manifest
from pipeline.shards.storage import run_record
from pipeline.shards.writer import write_shard

__all__ = ["H", "POINTS", "make_capture", "make_items", "make_manifest", "make_run", "make_sample"]

POINTS = ["b0", "b2", "final_norm"]
H = 16


def make_sample(i: int, num_tokens: int, *, seed: int = 0) -> PreparedSample:
    rng = np.random.default_rng(seed * 1000 + i)
    ids = rng.integers(0, 50_000, num_tokens, dtype=np.int64)
    mask = (rng.random(num_tokens) < 0.6).astype(np.uint8)
    return PreparedSample(sample_id=f"id-{seed}-{i}", source="chat.jsonl", row=i, input_ids_T=ids, loss_mask_T=mask,
                          truncated=i % 3 == 0)


def make_capture(sample: PreparedSample, dtype: torch.dtype = torch.float32) -> Capture:
    gen = torch.Generator().manual_seed(zlib.crc32(sample.sample_id.encode()))
    hs = torch.randn(sample.num_tokens, len(POINTS), H, generator=gen).mul(3).to(dtype)
    return Capture(sample_id=sample.sample_id, input_ids_T=sample.input_ids_T.copy(), hidden_states_TPH=hs)


def make_items(lengths, *, dtype=torch.float32, seed=0):
    samples = [make_sample(i, n, seed=seed) for i, n in enumerate(lengths)]
    return [(s, make_capture(s, dtype)) for s in samples]


def make_run(run_dir, shards_lengths, *, dtype=torch.float32, storage_dtype=None):
    """Write shards with write_shard and a manifest the way the extract stage does; returns the items per shard."""
    all_items, entries = [], []
    for index, lengths in enumerate(shards_lengths):
        items = make_items(lengths, dtype=dtype, seed=index)
        entries.append(write_shard(run_dir, index, items, points=POINTS, storage_dtype=storage_dtype,
                                   metadata={"engine": "hf 5.19.0", "run_digest": "abc123"}))
        all_items.append(items)
    make_manifest(run_dir, entries)
    return all_items


def make_manifest(run_dir, entries):
    """The manifest extract writes for these shard entries (its storage record included)."""
    num_tokens = sum(e.num_tokens for e in entries)
    write_manifest(run_dir, {
        "format_version": layout.FORMAT_VERSION, "points": POINTS, "hidden_size": H, "dtype": entries[0].dtype,
        "shards": [e.to_dict() for e in entries], "num_samples": sum(e.num_samples for e in entries),
        "num_tokens": num_tokens, "num_loss_tokens": sum(e.num_loss_tokens for e in entries), "provenance": {},
        "config": {}, "rejects": {},
        "storage": run_record([e.storage for e in entries], POINTS, hidden_size=H, num_tokens=num_tokens,
                              shard_bytes=sum(f["bytes"] for e in entries for f in e.files.values()))})
