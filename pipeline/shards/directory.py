"""The run directory as one kind of output directory (pipeline.core.lifecycle): extract writes it, its manifest makes
it finished, and a replacement keeps the lock being held and the gate's report written before the run starts."""
from __future__ import annotations

from pipeline.core.lifecycle import DirKind
from pipeline.shards.layout import DIFF_DIR, LOCK_NAME, RUN
from pipeline.shards.manifest import is_finished

RUN_DIR = DirKind(layout=RUN, noun="run", job="extract", kept=(LOCK_NAME, DIFF_DIR), is_finished=is_finished)
