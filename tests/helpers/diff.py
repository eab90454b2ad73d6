"""Helpers shared by the diff tests: compose the real config once per module, and a second Python environment."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from pipeline.config import register_configs
from tests.helpers import REPO

__all__ = ["SMALL_PROBE", "composed", "diff_composed", "second_python"]
SMALL_PROBE = ["diff.probe.num_samples=3", "diff.probe.max_tokens=64"]


def composed(*overrides: str, config_name: str = "config"):
    """The composed config, exactly as `python -m pipeline.extract` (or, with config_name="diff", `pipeline.diff`)
    sees it (module-scope safe)."""
    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            return compose(config_name=config_name, overrides=list(overrides))
    finally:
        GlobalHydra.instance().clear()


def diff_composed(*overrides: str):
    """The composed config exactly as `python -m pipeline.diff` sees it (conf/diff.yaml)."""
    return composed(*overrides, config_name="diff")


def second_python(root: Path) -> str:
    """A virtualenv of its own that sees this environment's packages: make_engine runs an engine whose
    options.python names it in a worker process (as it runs vLLM and SGLang in theirs)."""
    venv = root / "venv-other"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    here = next(p for p in sys.path if p.endswith("site-packages") and Path(p).resolve().is_relative_to(
        Path(sys.prefix).resolve()))
    (site / "pipeline_parent.pth").write_text(f"import site; site.addsitedir({here!r})\n")
    return str(venv / "bin" / "python")
