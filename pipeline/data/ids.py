"""Sample ids: what a sample is called in every shard, reject file and reader, derived from its source alone.

Kept apart from data preparation (which loads tokenizers) so that verify can recompute ids without importing it.
"""
from __future__ import annotations

import hashlib

SAMPLE_ID_HEX_CHARS = 16


def sample_id_for(source_digest: str, row: int) -> str:
    """Depends on the file's bytes and the row only, so a copy of the file anywhere gives the same ids."""
    return hashlib.sha256(f"{source_digest}:{row}".encode()).hexdigest()[:SAMPLE_ID_HEX_CHARS]
