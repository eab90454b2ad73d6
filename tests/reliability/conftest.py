"""What the reliability tests share: a finished run of the tiny default (one per module, which may change it)."""
from __future__ import annotations

import pytest

from tests.helpers.runs import SMALL, finished_run


@pytest.fixture(scope="module")
def finished(tmp_path_factory, models_root):
    return finished_run(tmp_path_factory, "finished", *SMALL)
