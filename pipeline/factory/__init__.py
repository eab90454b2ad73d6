"""The tiny-model factory: the embedded default and its twins, built locally in the target's real architecture and
checkpoint format (random weights, a tokenizer trained on the bundled conversations).

A product feature outside the library's layers: the entry points call `build_step` as the job's first explicit step
(`materialise` for one recipe), and the setup script builds every recipe (`python -m pipeline.factory`); no
library layer imports it (an import-linter contract), so validating a config never builds anything.
"""
from __future__ import annotations

from omegaconf import DictConfig

from pipeline.config import ConfigError
from pipeline.factory.tiny import materialise


def build_step(cfg: DictConfig) -> None:
    """Build the tiny model the composed config names (`model.build`), if any; ConfigError names what is wrong."""
    model = cfg.get("model") or {}
    try:
        materialise(model.get("build"), model.get("path"))
    except ValueError as e:
        raise ConfigError(f"model.build={model.get('build')!r}: {e}" if "model.path" not in str(e) else str(e)) from e
