"""The storage tests' finished local run (the S3 server's fixtures are in tests/conftest.py, shared with exports)."""
from __future__ import annotations

import pytest

from tests.helpers.runs import SMALL, finished_run


@pytest.fixture(scope="module")
def local_run(tmp_path_factory, models_root):
    return finished_run(tmp_path_factory, "local", *SMALL)
