"""Skip markers, defined once: for the engines that run in a virtualenv of their own, and for headless Chromium
(scripts/setup.sh installs them).

`needs_vllm` / `needs_sglang` (or `needs_engine(*names)`) and `needs_chromium` on a test, a class or a module's
`pytestmark`; a fixture that starts such an engine calls `skip_without(name)`.

The other markers, `integration` (every module under tests/integration) and `slow` (end-to-end runs of the entry
points), are registered in pyproject.toml (`--strict-markers`) and applied as `pytestmark = [pytest.mark.integration,
...]` at the top of each integration module (`slow` on single tests where only those run an entry point end to end).
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pipeline.engines.registry import REPO_ROOT, engine_class

__all__ = ["CHROMIUM", "SGLANG_PYTHON", "VLLM_PYTHON", "environment_python", "missing_environment",
           "needs_chromium", "needs_engine", "needs_sglang", "needs_vllm", "skip_without"]


def environment_python(name: str) -> Path | None:
    """The interpreter of engine `name`'s own virtualenv (`<repo>/<environment>/bin/python`, where make_engine runs
    it), or None for an engine that runs in this process."""
    environment = engine_class(name).environment
    return None if environment is None else REPO_ROOT / environment / "bin" / "python"


def missing_environment(name: str) -> str | None:
    """Why engine `name` cannot run here (its virtualenv is absent), or None."""
    python = environment_python(name)
    if python is None or python.exists():
        return None
    return f"engine {name}: {python} is absent: run scripts/setup.sh (scripts/engines/{name}.sh)"


def needs_engine(*names: str) -> pytest.MarkDecorator:
    reasons = [r for r in map(missing_environment, names) if r is not None]
    return pytest.mark.skipif(bool(reasons), reason="; ".join(reasons) or f"needs {', '.join(names)}")


def skip_without(name: str) -> None:
    """In a fixture: skip what uses it when engine `name`'s virtualenv is absent (marks do not apply to fixtures)."""
    reason = missing_environment(name)
    if reason is not None:
        pytest.skip(reason)


VLLM_PYTHON = environment_python("vllm")
SGLANG_PYTHON = environment_python("sglang")
needs_vllm = needs_engine("vllm")
needs_sglang = needs_engine("sglang")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (scripts/setup.sh installs Debian's chromium when run as root)")
