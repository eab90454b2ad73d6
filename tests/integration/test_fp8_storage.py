"""`runner.storage_dtype=float8_e4m3fn` on real captures of the tiny INT4 target: the rounding bound, bytes on disk,
the figures extract prints and the gate's report shows, and extract -> verify -> RunReader -> export."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from pipeline.shards.reader import RunReader
from tests.helpers.cli import cli
from tests.helpers.runs import extract, output, snapshot

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SMALL = ("data.limit=8", "runner.max_tokens_per_shard=800")
FP8 = "runner.storage_dtype=float8_e4m3fn"
H, NUM_POINTS = 256, 5  # the tiny Kimi: hidden size, and its default points [embed, 1, 4, 7, final_norm]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, models_root):
    """The same captures stored as captured (bf16, no gate) and in fp8 (with the default gate)."""
    root = tmp_path_factory.mktemp("fp8")
    plain = extract(root / "bf16", *SMALL, "gate.mode=off")
    assert plain.returncode == 0, output(plain)[-3000:]
    fp8 = extract(root / "fp8", *SMALL, FP8)
    assert fp8.returncode == 0, output(fp8)[-3000:]
    return root / "bf16", root / "fp8", fp8


def _states(run_dir):
    with RunReader(run_dir) as reader:
        return {s["sample_id"]: s["hidden_states"] for s in reader.iter_samples()}


def test_fp8_round_trip_stays_within_the_e4m3_bound_on_real_captures(runs):
    plain_dir, fp8_dir, _ = runs
    captured, read_back = _states(plain_dir), _states(fp8_dir)
    assert captured.keys() == read_back.keys()
    err = torch.zeros(NUM_POINTS, dtype=torch.float64)
    ref = torch.zeros(NUM_POINTS, dtype=torch.float64)
    with RunReader(fp8_dir, decode=False) as raw:
        for sample_id, x in captured.items():
            got, x = read_back[sample_id], x.float()
            assert got.dtype == torch.bfloat16 and got.shape == x.shape
            scale = raw[sample_id]["hidden_scales"].unsqueeze(-1)
            # half a step of e4m3's 3 mantissa bits, or half its smallest subnormal step at the row's scale; then the
            # bf16 rounding of the dequantized value
            bound = 2 ** -4 * x.abs() + 2 ** -10 * scale + 2 ** -8 * got.float().abs()
            assert ((got.float() - x).abs() <= bound).all(), sample_id
            err += (got.float() - x).pow(2).sum(dim=(0, 2), dtype=torch.float64)
            ref += x.pow(2).sum(dim=(0, 2), dtype=torch.float64)
    storage = json.loads((fp8_dir / "manifest.json").read_text())["storage"]
    measured = list(storage["rounding_rel_l2"].values())
    # what the writer measured while encoding (on every 4th token) is what a reader gets against what the engine
    # captured, over every token
    assert measured == pytest.approx((err / ref).sqrt().tolist(), rel=2e-2)
    assert all(0 < x < 0.035 for x in measured), measured


def test_fp8_halves_the_bytes_of_hidden_states(runs):
    plain_dir, fp8_dir, _ = runs
    plain = json.loads((plain_dir / "manifest.json").read_text())["storage"]
    fp8 = json.loads((fp8_dir / "manifest.json").read_text())["storage"]
    assert plain["hidden_bytes_per_token"] == plain["capture_hidden_bytes_per_token"] == NUM_POINTS * H * 2
    assert fp8["hidden_bytes_per_token"] == NUM_POINTS * (H + 4)  # a float32 scale per (token, point)
    sizes = [sum(p.stat().st_size for p in (d / "shards").glob("*.safetensors")) for d in (plain_dir, fp8_dir)]
    assert sizes[1] / sizes[0] < (H + 4 + 17 / NUM_POINTS) / (2 * H)  # + ids, loss mask, offsets per token


def test_extract_prints_the_rounding_beside_the_gate_divergence_and_the_report_shows_it(runs):
    _, fp8_dir, proc = runs
    text = proc.stdout
    assert f"storage: hidden states float8_e4m3fn, {NUM_POINTS * (H + 4):,} B/token on disk" in text
    assert "beside the engines' divergence (hf (primary) vs hf@float32, diff gate)" in text
    storage = json.loads((fp8_dir / "manifest.json").read_text())["storage"]
    report = json.loads((fp8_dir / "diff" / "report.json").read_text())
    pair = next(p for p in report["pairs"] if p["kind"] == "reference")
    for point, rounding in storage["rounding_rel_l2"].items():
        engines = pair["points"][point]["rel_l2"]
        assert f"{point:>10}: storage {rounding:.2e}  engines {engines:.2e}" in text
    # the report measures the same rounding on the primary's probe captures
    probe = report["storage"]["rel_l2"]["hf (primary)"]
    assert report["storage"]["dtype"] == "float8_e4m3fn" and probe.keys() == storage["rounding_rel_l2"].keys()
    assert all(0 < x < 0.035 for x in probe.values()), probe
    assert "## Storage rounding: runner.storage_dtype=float8_e4m3fn" in (fp8_dir / "diff" / "report.md").read_text()


def test_fp8_run_verifies_reads_and_exports_in_the_capture_dtype(runs, tmp_path):
    _, fp8_dir, _ = runs
    done = cli("pipeline.verify", str(fp8_dir))
    assert done.returncode == 0 and "dtype float8_e4m3fn" in done.stdout, done.stderr
    out = tmp_path / "export"
    done = cli("pipeline.export", str(fp8_dir), "--format", "specforge", "--out", str(out))
    assert done.returncode == 0, done.stderr
    sidecar = json.loads((out / "export.json").read_text())
    assert sidecar["dtype"] == "bfloat16" and sidecar["storage"]["dtype"] == "float8_e4m3fn"
    assert "dequantized to bfloat16" in sidecar["last_state"]["how"]
    # what the trainers' own loaders read from such an export: tests/exports (the fp8 run)


def test_a_bad_storage_dtype_is_a_config_error(tmp_path, models_root):
    done = extract(tmp_path / "run", "runner.storage_dtype=int3")
    assert done.returncode == 2, output(done)[-2000:]
    assert "runner.storage_dtype='int3': must be null or one of ('float8_e4m3fn',)" in output(done)
    assert not (tmp_path / "run").exists()


def test_resuming_with_another_storage_dtype_is_refused(runs, tmp_path):
    _, fp8_dir, _ = runs
    run = tmp_path / "run"
    shutil.copytree(fp8_dir, run)
    (run / "manifest.json").unlink()  # an interrupted fp8 run
    before = _without_lock(snapshot(run))
    done = extract(run, *SMALL)  # the default storage
    assert done.returncode == 2, output(done)[-2000:]
    assert "holds an unfinished run with a different" in output(done), output(done)[-2000:]
    assert "config (runner.storage_dtype: 'float8_e4m3fn' then, None now)" in output(done), output(done)[-2000:]
    assert _without_lock(snapshot(run)) == before  # the refusal touched nothing but the lock it held


def _without_lock(files: dict[str, bytes]) -> dict[str, bytes]:
    return {k: v for k, v in files.items() if k != ".lock"}
