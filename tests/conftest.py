"""Shared fixtures: composed configs and the tiny local models (built once per machine, cached under .cache/)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from pipeline.config import register_configs

REPO = Path(__file__).resolve().parent.parent
CONF = REPO / "conf"


@pytest.fixture(scope="session")
def models_root() -> Path:
    root = Path(os.environ.get("PIPELINE_MODELS_DIR", REPO / ".cache" / "models"))
    os.environ["PIPELINE_MODELS_DIR"] = str(root)
    return root


@pytest.fixture(scope="session")
def tiny_model(models_root):
    from pipeline.factory.tiny import ensure_model

    return lambda name: ensure_model(name, models_root)


@pytest.fixture
def compose_cfg(models_root):
    """compose_cfg(*overrides) -> the composed extract config, exactly as `python -m pipeline.extract` sees it."""
    register_configs()

    def _compose(*overrides: str):
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return compose(config_name="config", overrides=list(overrides))

    yield _compose
    GlobalHydra.instance().clear()


@pytest.fixture(scope="session")
def kimi_dir(tmp_path_factory) -> Path:
    """A Kimi-style remote-code tokenizer directory (pipeline.factory.kimi_tokenizer), written once per session."""
    from pipeline.factory.kimi_tokenizer import write_kimi_tokenizer

    out = tmp_path_factory.mktemp("kimi_tok")
    write_kimi_tokenizer(out)
    return out
