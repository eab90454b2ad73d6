"""The diff gate inside `pipeline.extract`: a wrong capture convention stops the run before any shard exists; the
default run passes it with its cost measured; its summary lands in the manifest and in every shard."""
from __future__ import annotations

import base64
import json

import pytest
from safetensors import safe_open

from pipeline.run.gate import DiffGateError, gate_lines
from pipeline.run.job import run_extract
from pipeline.shards.verify import verify_run
from tests.helpers.diff import composed
from tests.helpers.faulty_engines import registered

pytestmark = [pytest.mark.integration]
SMALL = ["data.limit=6", "data.max_length=96", "runner.max_samples_per_shard=3", "gate.probe.num_samples=3"]


@pytest.fixture(scope="module", autouse=True)
def _faulty_engines():
    with registered():
        yield


def extract(out, *overrides):
    return run_extract(composed(f"out_dir={out}", *SMALL, *overrides))


@pytest.mark.parametrize("remap, named", [
    ("{b4:b5}", "hf-remap@float32 (primary)'s b4 is reference b5"),
    ("{b1:b4,b4:b1}", "hf-remap@float32 (primary)'s b1 and b4 are swapped"),
])
def test_a_convention_error_stops_extract_before_any_shard(tmp_path, models_root, remap, named):
    out = tmp_path / "run"
    with pytest.raises(DiffGateError) as stop:
        extract(out, "engine.name=hf-remap", "engine.dtype=float32", f"+engine.options.remap={remap}")
    message = str(stop.value)
    # a failing gate draws its plots (gate.html=on_failure): the message points at them
    assert named in message and f"report: {out.resolve()}/diff/report.html" in message
    assert "gate.mode=warn" in message  # how to proceed anyway
    assert sorted(p.name for p in out.iterdir()) == [".lock", "diff"]  # the released lock; no shards, manifest or run record
    report = json.loads((out / "diff" / "report.json").read_text())
    assert report["status"] == "fail" and any(named in p for a in report["alignment"] for p in a["problems"])
    # the fixed engine then runs in the same directory
    summary = extract(out, "engine.dtype=float32")
    assert summary.num_samples == 6 and summary.gate.status == "pass"
    assert (out / "manifest.json").is_file()


def test_the_default_run_passes_the_gate_and_records_it(tmp_path, models_root):
    out = tmp_path / "run"
    summary = extract(out)
    gate = summary.gate
    assert gate.mode == "stop" and gate.status == "warn"  # bf16 vs float32 on an MoE model: routing flips
    assert 0 < gate.seconds < summary.seconds
    # a gate the run went through draws no plots (gate.html=on_failure); they can be drawn from report.json
    assert sorted(p.name for p in (out / "diff").iterdir()) == ["report.json", "report.md"]
    assert f"plots: python -m pipeline.compare.html {(out / 'diff').resolve()}" in gate_lines(gate, summary.seconds)[0]
    manifest = json.loads((out / "manifest.json").read_text())
    diff = manifest["provenance"]["diff"]
    assert diff["status"] == "warn" and diff["report"] == "diff/report.json"
    assert diff["reference"] == "hf@float32" and diff["alignment"] == {"hf (primary)": "ok"}
    (pair,) = diff["pairs"].values()
    assert pair["dtype"] == "bfloat16" and pair["routing_flips"] and pair["first_divergent"] in ("b4", "b7")
    for shard in manifest["shards"]:
        with safe_open(str(out / "shards" / f"{shard['name']}.safetensors"), "pt") as f:
            assert json.loads(f.metadata()["diff"]) == diff
    # a resumed run re-checks the engine and keeps its shards
    (out / "manifest.json").unlink()
    resumed = extract(out)
    assert resumed.resumed_shards == len(manifest["shards"]) and resumed.gate.status == "warn"


def test_warn_mode_captures_anyway_and_says_so(tmp_path, models_root):
    out = tmp_path / "run"
    summary = extract(out, "engine.name=hf-remap", "engine.dtype=float32", "+engine.options.remap={b4:b5}",
                      "gate.mode=warn", "gate.html=never")
    assert summary.gate.status == "fail" and summary.num_samples == 6
    assert not (out / "diff" / "report.html").exists()
    diff = json.loads((out / "manifest.json").read_text())["provenance"]["diff"]
    assert diff["status"] == "fail" and diff["alignment_problems"][0].startswith(
        "hf-remap@float32 (primary)'s b4 is reference b5")


def test_gate_off_runs_nothing(tmp_path, models_root):
    out = tmp_path / "run"
    summary = extract(out, "gate.mode=off")
    assert summary.gate.status == "off" and not (out / "diff").exists()
    assert json.loads((out / "manifest.json").read_text())["provenance"]["diff"] == {"status": "off", "gate": "off"}


def test_a_reference_that_cannot_run_is_a_config_error_before_any_work(tmp_path, models_root):
    from pipeline.config import ConfigError

    out = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"diff gate engine hf \(reference\): engine='hf' runs in its own "
                                          r"environment, but /nowhere/bin/python does not exist"):
        extract(out, "diff.reference={name:hf,options:{python:/nowhere/bin/python}}")
    assert not out.exists()


def attested_files(run_dir) -> list[str]:
    envelope = json.loads((run_dir / "attestation.intoto.json").read_text())
    return [subject["name"] for subject in json.loads(base64.b64decode(envelope["payload"]))["subject"]]


def test_always_draws_the_plots_after_the_run_and_counts_them(tmp_path, models_root):
    out = tmp_path / "run"
    summary = extract(out, "engine.dtype=float32", "gate.html=always")
    gate = summary.gate
    assert gate.status == "pass" and (out / "diff" / "report.html").is_file()
    drawn = gate.parts["report.html (after the run)"]
    assert drawn > 0 and gate.seconds == pytest.approx(sum(gate.parts.values()))
    assert f"report: {(out / 'diff').resolve()}/report.html" in gate_lines(gate, summary.seconds)[0]
    # drawn before the run is attested: the plots are one of its files, and the run verifies with them
    assert "diff/report.html" in attested_files(out) and verify_run(out) == []
