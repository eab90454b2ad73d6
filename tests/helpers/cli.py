"""`python -m <module> ...` in a child process, from the repository root, as a user would run the entry points."""
from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers import REPO

__all__ = ["cli"]


def cli(module: str, *args: str, timeout: float = 600, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess:
    """Run it to the end and return what it did (no check: the tests read returncode, stdout and stderr); `env` adds
    variables to this process's environment."""
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=None if env is None else {**os.environ, **env}, check=False)
