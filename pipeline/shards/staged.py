"""A run on object storage, staged in a local scratch directory for the checks that read files (pipeline.verify):
every object of the prefix but the shards' states is copied there (the Parquet indexes, markers, rejects and reports:
small); each `.safetensors` is an empty (sparse) file of its size, filled with its bytes while its shard is checked
and emptied after, so the scratch directory holds one shard's states at a time. An object a run does not write is
staged as an empty file of its size too (the checks name it by name; its bytes are never read)."""
from __future__ import annotations

import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, ContextManager, Iterator

from pipeline.core.outdir import Layout
from pipeline.core.storage import Store, download
from pipeline.shards import layout
from pipeline.shards.writer import ShardEntry

_STATES = layout.SHARD_SUFFIXES["safetensors"]

Fetch = Callable[[ShardEntry], ContextManager[None]]


def _local(root: Path, key: str) -> Path | None:
    """Where `key` is staged; None for a key no file of the scratch directory can stand for (`..`, absolute)."""
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        return None
    return root.joinpath(*parts)


def _placeholder(path: Path, size: int) -> None:
    """An empty (sparse) file of `size` bytes where an object stands whose bytes are not read now."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)


@contextmanager
def staged(store: Store, scratch: str | Path | None = None,
           kind: Layout = layout.RUN) -> Iterator[tuple[Path, Fetch]]:
    """(the staged directory, `fetch`): `with fetch(entry):` has a run's shard's states in place for that block.
    `kind`: the layout whose files are copied (another's, a regeneration's, has no states)."""
    listing = {o.key: o for o in store.list()}
    foreign = set(kind.foreign_keys(listing))
    with tempfile.TemporaryDirectory(prefix="staged-run-", dir=scratch) as tmp:
        root = Path(tmp) / "run"
        root.mkdir()
        for key, info in listing.items():
            path = _local(root, key)
            if path is None:
                continue
            if key in foreign or key.endswith(_STATES):  # states: in place only while their shard is checked
                _placeholder(path, info.size)
            else:
                download(store, key, path, info.size)

        @contextmanager
        def fetch(entry: ShardEntry) -> Iterator[None]:
            brought = []
            for rel in entry.files:
                path = _local(root, rel) if isinstance(rel, str) else None
                if path is None or not rel.endswith(_STATES) or rel not in listing or rel in foreign:
                    continue
                download(store, rel, path, listing[rel].size)
                brought.append(path)
            try:
                yield
            finally:
                for path in brought:
                    _placeholder(path, path.stat().st_size)

        yield root, fetch
