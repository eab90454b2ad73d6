"""Shared fixtures: composed configs and the tiny local models (built once per machine, cached under .cache/)."""
from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from pipeline.config import register_configs
from tests.helpers import seaweed
from tests.helpers.sweep import EVERY_CASE

REPO = Path(__file__).resolve().parent.parent
CONF = REPO / "conf"


def pytest_addoption(parser):
    parser.addoption("--every-case", action="store_true",
                     help="run every case of each sweep (tests/helpers/sweep.py), not only the representative ones")


# The suite runs as two streams, one per core (pytest-xdist, `-n 2 --dist loadscope` in pyproject.toml): one stream runs,
# one after another, every module that starts vLLM, SGLang or a Ray cluster (their ports, core bindings, memory
# reservations and process scans must never meet another's); the other takes the rest a module at a time (a module's
# fixtures are built once, on one worker; the exports share one session's runs).
ENGINE_MODULES = {f"tests/integration/{name}.py" for name in (
    "test_accept", "test_closed_loop", "test_diff_serving_engines", "test_doctor_engines", "test_k25_engines",
    "test_k25_layout", "test_k25_recipe", "test_ray", "test_real_model", "test_real_model_int4", "test_regenerate",
    "test_remote_engine", "test_sglang_engine", "test_sglang_generate", "test_vllm_engine")} | {
    f"tests/reliability/{name}.py" for name in ("test_ray_job_security", "test_regen_reliability", "test_same_threads")
} | {"tests/storage/test_ray_to_s3.py"}


def _stream(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0]
    if module in ENGINE_MODULES:
        return "engines"
    return "exports" if module.startswith("tests/exports/") else module


def pytest_xdist_make_scheduler(config, log):
    """xdist's loadscope with our scopes (its loadgroup markers do not reach pytest 9.2's node ids)."""
    from xdist.scheduler import LoadScopeScheduling

    class Streams(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _stream(nodeid)

    return Streams(config, log)


def pytest_collection_modifyitems(config, items):
    if config.getoption("--every-case"):
        return
    left = [item for item in items if item.get_closest_marker(EVERY_CASE)]
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = [item for item in items if not item.get_closest_marker(EVERY_CASE)]


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


def pytest_terminal_summary(terminalreporter):
    """The documented commands' inventory, after a run that ran them (tests/docs/test_commands.py)."""
    reports = [r for reports in terminalreporter.stats.values() for r in reports if hasattr(r, "nodeid")]
    if not any(r.nodeid.startswith("tests/docs/test_commands.py::test_the_page_commands_run") for r in reports):
        return
    from tests.helpers.docblocks import inventory

    try:
        terminalreporter.write_sep("-", "documented commands")
        terminalreporter.write_line(inventory())
    except ValueError as e:  # a page the harness refuses: its test says so too
        terminalreporter.write_line(f"documented commands: {e}")


# A SeaweedFS server on loopback (one per test worker, started by the first test that needs it), a fresh prefix per test.
@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    server = seaweed.start(tmp_path_factory.mktemp("seaweed"))
    yield server
    server.stop()


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """The server's endpoint and credentials in the standard AWS variables, as a user sets them."""
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    return s3_server


@pytest.fixture
def s3_url(s3_env):
    return s3_env.url(f"t-{uuid.uuid4().hex[:12]}")


@pytest.fixture
def small_fs(tmp_path):
    """A 4 MiB tmpfs (a small file system, for the capacity checks): the tiny default's six samples (~3 MB of states
    at width 256) do not fit in it."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)
