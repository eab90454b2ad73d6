"""The checkpoint's token-embedding table, read straight from its safetensors files (no framework involved).

The embedding output is a row lookup, so taking it from the table is exact by construction: it is the point where
SGLang's Llama aux capture has no id. Only the one tensor is read; an index file, when present, says which shard
holds it.
"""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from pipeline.core.jsonfile import read_fields

SUFFIX = "embed_tokens.weight"


def _candidates(model_dir: Path) -> dict[str, str]:
    """tensor name -> file name, for every tensor that looks like a token-embedding table."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_fields(index, ValueError).obj("weight_map").value
        return {k: v for k, v in weight_map.items() if k.endswith(SUFFIX)}
    found = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            found.update({k: file.name for k in f.keys() if k.endswith(SUFFIX)})
    return found


def embedding_key(model_dir: str | Path) -> tuple[str, str]:
    """(tensor name, file name) of the language model's embedding table."""
    model_dir = Path(model_dir)
    found = _candidates(model_dir)
    # Multimodal checkpoints (Kimi-K2.5) hold the language model under a prefix; a vision tower has no embed_tokens.
    if len(found) != 1:
        raise ValueError(f"model.path={str(model_dir)!r}: expected exactly one tensor named '*{SUFFIX}' in the "
                         f"checkpoint (the token-embedding table), found {sorted(found) or 'none'}")
    return next(iter(found.items()))


def load_embedding_table(model_dir: str | Path, dtype: torch.dtype) -> tuple[str, torch.Tensor]:
    key, file = embedding_key(model_dir)
    with safe_open(str(Path(model_dir) / file), framework="pt") as f:
        table = f.get_tensor(key)
    return key, table.to(dtype)


def lookup(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    vocab = table.shape[0]
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise ValueError(f"token id out of range for the embedding table ({vocab} rows): "
                         f"min {int(ids.min())}, max {int(ids.max())}")
    return table[ids]
