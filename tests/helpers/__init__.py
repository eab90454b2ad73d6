"""Helpers shared by the test modules (no test module imports another): `from tests.helpers.<module> import ...`.

- `shards`: synthetic samples and captures, and whole run directories written the way the extract stage writes them.
- `samples`: synthetic `PreparedSample`s for the engines, `rel_l2`, and `cli` (`python -m <module>` in the repository).
- `diff`: the composed config for the diff tests (`composed`, `SMALL_PROBE`) and a second Python environment.
- `faulty_engines`: engines with injected errors (`registered()` puts them in the engine registry).
- `runs`: real `python -m pipeline.extract` processes with a fault hook, and what the reliability tests check.
- `reference`: the independent layer-by-layer computation captured points are checked against.
- `markers`: skip markers for an engine whose own virtualenv is absent (`needs_vllm`, `needs_sglang`).

The fixtures (`compose_cfg`, `tiny_model`, `models_root`) are in `tests/conftest.py`.
"""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
