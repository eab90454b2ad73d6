"""The closed loop (tests/helpers/loop.py), built once per test session: test_closed_loop.py measures the wiring with
it and test_accept.py proves accept's report on its measurement. Both modules are in the engines stream
(tests/conftest.py), so one worker builds it."""
from __future__ import annotations

import pytest

from tests.helpers.loop import Loop, build_loop
from tests.helpers.markers import skip_without
from tests.helpers.trainers import SPECULATORS_PYTHON


@pytest.fixture(scope="session")
def closed_loop(tiny_model, tmp_path_factory) -> Loop:
    skip_without("vllm")
    if not SPECULATORS_PYTHON.exists():
        pytest.fail(f"{SPECULATORS_PYTHON} is missing: run bash scripts/trainers/speculators.sh "
                    "(scripts/setup.sh runs it)")
    return build_loop(tmp_path_factory.mktemp("closed-loop"), tiny_model("smollm2-135m-instruct"))
