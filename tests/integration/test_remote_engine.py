"""An engine in a worker process (how vLLM and SGLang run in their own virtualenvs), exercised with the HF engine."""
from __future__ import annotations

import fcntl
import sys

import numpy as np
import pytest
import torch

from pipeline.core.contracts import EngineSpec
from pipeline.engines.process.remote import EngineWorkerError, RemoteEngine
from pipeline.engines.registry import engine_class, make_engine
from pipeline.points import parse_points
from tests.helpers.samples import samples_of

pytestmark = [pytest.mark.integration]
HF = "pipeline.engines.hf:HFEngine"


def spec(**options):
    return EngineSpec(name="hf", dtype="float32", options=options)


def kwargs(path):
    points = parse_points(["embed", 4, "last", "final_norm"], num_layers=8)
    return dict(model_path=str(path), points=points, num_layers=8)


def test_remote_equals_in_process_bit_for_bit(tiny_model):
    path = tiny_model("tiny-kimi-int4")
    batch = samples_of([9, 30, 2], vocab=3000)
    with engine_class("hf")(spec(), **kwargs(path)) as local:
        expected, local_info = local.capture(batch), local.info()
    with RemoteEngine(spec(), target=HF, python=sys.executable, **kwargs(path)) as remote:
        got, remote_info = remote.capture(batch), remote.info()
        if hasattr(fcntl, "F_GETPIPE_SZ"):  # Linux: the captures come through a 1 MiB pipe, not a 64 KiB one
            assert fcntl.fcntl(remote._rx.fileno(), fcntl.F_GETPIPE_SZ) == 1 << 20
    assert [c.sample_id for c in got] == [s.sample_id for s in batch]
    for e, g in zip(expected, got):
        assert g.hidden_states_TPH.dtype == torch.float32
        assert torch.equal(e.hidden_states_TPH, g.hidden_states_TPH)
        assert np.array_equal(e.input_ids_T, g.input_ids_T)
    assert remote_info == local_info


def test_make_engine_uses_a_worker_when_another_python_is_named(tiny_model):
    path = tiny_model("tiny-kimi-int4")
    other = f"{sys.base_prefix}/bin/python3"  # exists, but is not this virtualenv
    engine = make_engine(spec(python=other), **kwargs(path))
    assert isinstance(engine, RemoteEngine) and engine.python == other
    assert not isinstance(make_engine(spec(), **kwargs(path)), RemoteEngine)
    assert not isinstance(make_engine(spec(python=sys.executable), **kwargs(path)), RemoteEngine)
    with pytest.raises(FileNotFoundError, match="/opt/nowhere/bin/python does not exist; run scripts/setup.sh"):
        make_engine(spec(python="/opt/nowhere/bin/python"), **kwargs(path))


def test_an_error_in_the_worker_is_raised_with_its_traceback(tmp_path):
    engine = RemoteEngine(spec(), target=HF, python=sys.executable, **kwargs(tmp_path / "no-model"))
    with pytest.raises(EngineWorkerError, match="failed during 'start'.*no-model") as err:
        engine.start()
    assert "worker traceback" in str(err.value)
    engine.close()


def test_a_dead_worker_is_reported_not_hung(tiny_model):
    with RemoteEngine(spec(), target=HF, python=sys.executable, **kwargs(tiny_model("tiny-kimi-int4"))) as engine:
        engine._proc.kill()
        with pytest.raises(EngineWorkerError, match="exited with code -9 during 'capture'"):
            engine.capture(samples_of([5], vocab=3000))
