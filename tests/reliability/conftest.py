"""What the reliability tests share: a finished run of the tiny default (one per module, which may change it)."""
from __future__ import annotations

import pytest

from tests.helpers.runs import SMALL, extract, output


@pytest.fixture(scope="module")
def finished(tmp_path_factory, models_root):
    out = tmp_path_factory.mktemp("finished") / "run"
    done = extract(out, *SMALL)
    assert done.returncode == 0, output(done)[-3000:]
    return out
