"""The probe's request stays as asked and its capture is returned, never filled in; the fixed words are StrEnums that
write the same strings as before."""
from __future__ import annotations

import dataclasses
import json

import pytest

from pipeline.compare.kinds import PairKind, Role, Status, Step
from pipeline.compare.probe import ProbeCapture, ProbeRequest, probe_engine
from pipeline.config import ProbeConfig
from pipeline.core.contracts import EngineSpec
from pipeline.points import Point


def request_in(model_dir) -> ProbeRequest:
    return ProbeRequest(label="hf (no model)", role=Role.ENGINE, spec=EngineSpec(name="hf"), model_path=str(model_dir),
                        points=[Point(0), Point(None)])


def test_an_engine_that_cannot_start_comes_back_as_a_capture_naming_the_step(tmp_path):
    request = request_in(tmp_path)  # an empty directory: the engine is made, and fails to start
    before = dataclasses.asdict(request)
    captured = probe_engine(request, [], ProbeConfig(), num_layers=1, hidden_size=8)
    assert isinstance(captured, ProbeCapture) and captured.request is request
    assert dataclasses.asdict(request) == before
    assert captured.failed_at == Step.START and captured.start_failed and not captured.ok
    assert "model_type" in captured.error
    assert list(captured.seconds) == ["close", "total"]  # start never finished; close and total always run
    assert captured.ran_on and captured.label == request.label and captured.labels == ["b0", "final_norm"]


def test_requests_and_captures_are_frozen(tmp_path):
    captured = ProbeCapture(request=request_in(tmp_path))
    with pytest.raises(dataclasses.FrozenInstanceError):
        captured.error = "x"
    with pytest.raises(dataclasses.FrozenInstanceError):
        captured.request.role = Role.REFERENCE


def test_the_enums_write_the_words_reports_always_had():
    words = [Role.PRIMARY, PairKind.DETERMINISM, Status.FAIL, Step.PROBE]
    assert json.dumps(words) == '["primary", "determinism", "fail", "probe"]'
    assert [f"{w}" for w in words] == ["primary", "determinism", "fail", "probe"]
    assert Status("warn") is Status.WARN and "pass" == Status.PASS
