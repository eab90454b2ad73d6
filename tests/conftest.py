"""Shared fixtures: composed configs and the tiny local models (built once per machine, cached under .cache/)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from pipeline.config import register_configs
from tests.helpers.sweep import EVERY_CASE

REPO = Path(__file__).resolve().parent.parent
CONF = REPO / "conf"


def pytest_addoption(parser):
    parser.addoption("--every-case", action="store_true",
                     help="run every case of each sweep (tests/helpers/sweep.py), not only the representative ones")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--every-case"):
        return
    left = [item for item in items if item.get_closest_marker(EVERY_CASE)]
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = [item for item in items if not item.get_closest_marker(EVERY_CASE)]
        config.stash[_LEFT] = len(left)


def pytest_terminal_summary(terminalreporter, config):
    left = config.stash.get(_LEFT, 0)
    if left:
        terminalreporter.write_line(f"{left} further cases of sweeps not run: pytest --every-case runs them")


_LEFT = pytest.StashKey[int]()


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
