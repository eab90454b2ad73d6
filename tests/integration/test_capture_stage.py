"""The capture stage on the real HF engine: units written while the next is captured, in order, never half written."""
from __future__ import annotations

import json

import pytest

from pipeline.core.contracts import EngineSpec, PreparedSample
from pipeline.engines.registry import make_engine
from pipeline.models.info import read_model_info
from pipeline.points import parse_points
from pipeline.run.capture import CaptureStage, StageSettings, finished_unit
from pipeline.run.contract import run_units
from tests.helpers.samples import samples_of

pytestmark = [pytest.mark.integration]


def unit(first: int, lengths: list[int], vocab: int, seed: int) -> list[PreparedSample]:
    return samples_of(lengths, vocab=vocab, seed=seed, first=first)


@pytest.fixture(scope="module")
def stage(tiny_model):
    path = tiny_model("tiny-llama")
    info = read_model_info(path)
    points = parse_points(["embed", 1, "last", "final_norm"], num_layers=info.num_layers)
    settings = StageSettings(points=points, hidden_size=info.hidden_size, batch_size=2, storage_dtype=None,
                             metadata={"test": "capture_stage"})
    with make_engine(EngineSpec(name="hf", dtype="float32"), model_path=str(path), points=points,
                     num_layers=info.num_layers) as engine:
        vocab = json.loads((path / "config.json").read_text())["vocab_size"]
        yield CaptureStage(engine=engine, settings=settings), vocab


def test_overlapped_units_equal_units_run_one_by_one(stage, tmp_path):
    stage, vocab = stage
    units = [unit(3 * k, [5 + k, 17, 9], vocab, seed=k) for k in range(4)]
    done = []
    run_units(stage, tmp_path / "overlapped", enumerate(units), done.append, overlap=True)
    assert [r.index for r in done] == [0, 1, 2, 3]  # reported in unit order, each exactly once
    serial = [stage.run_unit(tmp_path / "serial", index, samples) for index, samples in enumerate(units)]
    assert [r.entry.num_samples for r in done] == [3, 3, 3, 3] and not any(r.rejects for r in done)
    # Same files, byte for byte (sha256 and size per file), as running the units one after the other.
    assert [r.entry.files for r in done] == [r.entry.files for r in serial]
    assert all(finished_unit(tmp_path / "overlapped", i) is not None for i in range(4))


def test_a_failing_capture_leaves_the_unit_in_flight_fully_written(stage, tmp_path):
    stage, vocab = stage
    good = unit(0, [8, 6], vocab, seed=0)
    bad = unit(2, [7], vocab, seed=1)
    bad[0].input_ids_T[3] = vocab + 5  # out of the embedding table: the real engine raises
    done = []
    with pytest.raises(IndexError):
        run_units(stage, tmp_path, enumerate([good, bad, good]), done.append, overlap=True)
    assert done == []  # unit 0's write was in flight when unit 1's capture failed; it was awaited, not reported
    finished = finished_unit(tmp_path, 0)
    assert finished is not None and finished.entry.num_samples == 2  # complete: marker, sizes and sha256 agree
    assert finished_unit(tmp_path, 1) is None and finished_unit(tmp_path, 2) is None
