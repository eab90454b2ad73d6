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


def not_the_recipe_dir(recipe: str, path: str, group: str | None = None) -> str:
    """Why `path` cannot be the built model `recipe` (of model group `group`), and what to write instead."""
    which = f"model={group} is the tiny model" if group else "model.build names the tiny model"
    return (f"model.path={path!r} is not named after its recipe {recipe!r}: {which} {recipe!r}, which the job builds "
            f"into a directory named after its recipe, with that model's capture points and settings. For your own "
            f"checkpoint write model=local model.path={path} model.points=[...] (nothing is inherited: "
            f"model.trust_remote_code stays off unless you set it); to build {recipe!r} there, give "
            f"model.path=<a directory>/{recipe}")


def built_model_dir(recipe: str, path: str | None) -> Path:
    """The directory of built model `recipe`: `path` when given (it must be named after the recipe), else under
    models_root(). ValueError says what is wrong; nothing is built here."""
    where = Path(path) if path else models_root() / recipe
    if where.name != recipe:
        raise ValueError(not_the_recipe_dir(recipe, str(path)))
    if not (where / MARKER).is_file():
        raise ValueError(f"model.path={str(where)!r}: the model {recipe!r} is not built there; the entry points build "
                         f"it before the run (or: python -m pipeline.factory --root {where.parent} {recipe})")
    return where
