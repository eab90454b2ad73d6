"""#36 item 3: the HF reference engine's device (`engine.options.device`): a CUDA device the host lacks is one line,
exit 2, before any weight is read; `auto` falls back to the CPU; the device is in the provenance."""
from __future__ import annotations

import json

import pytest
import torch

from tests.helpers.runs import SMALL, extract, output

pytestmark = pytest.mark.reliability


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has a CUDA device")
@pytest.mark.parametrize("device", ["cuda", "cuda:3"])
def test_a_cuda_device_this_host_lacks_is_refused_before_any_weight_is_read(tmp_path, models_root, device):
    done = extract(tmp_path / "run", *SMALL, f"engine.options.device={device}")
    assert done.returncode == 2, output(done)[-3000:]
    errors = [line for line in output(done).splitlines() if "[ERROR]" in line]
    assert len(errors) == 1 and f"engine.options.device='{device}': this host has 0 CUDA device(s)" in errors[0]
    assert "Loading weights" not in output(done) and "Traceback" not in output(done)
    assert not list((tmp_path / "run").glob("shards/*"))


def test_a_device_that_is_no_device_is_a_configuration_error(tmp_path, models_root):
    done = extract(tmp_path / "run", *SMALL, "engine.options.device=gpu")
    assert done.returncode == 2
    assert "engine.options.device='gpu': must be cpu, cuda, cuda:N or auto" in output(done)


def test_auto_runs_where_it_can_and_the_device_is_recorded(tmp_path, models_root):
    done = extract(tmp_path / "run", *SMALL, "engine.options.device=auto")
    assert done.returncode == 0, output(done)[-3000:]
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    expected = "cuda:0" if torch.cuda.is_available() else "cpu"
    assert manifest["provenance"]["engine"]["extra"]["device"] == expected
