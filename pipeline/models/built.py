"""Where the locally built models live (the embedded default and its twins), read without building anything.

The factory (`pipeline.factory`) builds them; the library only finds them: a built model is a directory named after
its recipe, holding the factory's completion marker.
"""
from __future__ import annotations

import os
from pathlib import Path

MODELS_DIR_ENV = "PIPELINE_MODELS_DIR"
MARKER = ".built.json"  # written last by the factory: the directory is complete once it exists
CONVERSION = "conversion.json"  # in a model converted from a registry package: its source and converters


def models_root() -> Path:
    """$PIPELINE_MODELS_DIR, else <repository>/.cache/models."""
    env = os.environ.get(MODELS_DIR_ENV)
    return Path(env) if env else Path(__file__).resolve().parents[2] / ".cache" / "models"


def built_model_dir(recipe: str, path: str | None) -> Path:
    """The directory of built model `recipe`: `path` when given (it must be named after the recipe), else under
    models_root(). ValueError says what is wrong; nothing is built here."""
    where = Path(path) if path else models_root() / recipe
    if where.name != recipe:
        raise ValueError(f"model.path={path!r}: a built model lives in a directory named after its recipe {recipe!r}")
    if not (where / MARKER).is_file():
        raise ValueError(f"model.path={str(where)!r}: the model {recipe!r} is not built there; the entry points build "
                         f"it before the run (or: python -m pipeline.factory --root {where.parent} {recipe})")
    return where
