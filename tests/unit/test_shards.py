"""Shards: real write-then-read round trips, work-unit planning, resume markers, capture validation."""
from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from safetensors import safe_open

from pipeline.core.contracts import Capture
from pipeline.shards import layout
from pipeline.shards.manifest import (
    ManifestError,
    is_finished,
    read_manifest,
    write_manifest,
)
from pipeline.shards.plan import plan_units
from pipeline.shards.reader import RunReader
from pipeline.shards.storage import choose, rounding_rel_l2
from pipeline.shards.validate import capture_reject, check_capture
from pipeline.shards.writer import ShardEntry, completed_shard, write_shard
from tests.helpers.shards import (
    POINTS,
    H,
    make_capture,
    make_items,
    make_manifest,
    make_run,
    make_sample,
)


# --- write -> read round trips ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_round_trip_is_exact(tmp_path, dtype):
    shards = make_run(tmp_path, [[5, 1, 9], [4, 7]], dtype=dtype)
    with RunReader(tmp_path) as reader:
        assert len(reader) == 5 and reader.points == POINTS
        assert reader.sample_ids == [s.sample_id for items in shards for s, _ in items]
        for items in shards:
            for sample, capture in items:
                got = reader[sample.sample_id]
                assert got["hidden_states"].dtype == dtype
                assert torch.equal(got["hidden_states"], capture.hidden_states_TPH)
                assert np.array_equal(got["input_ids"].numpy(), sample.input_ids_T)
                assert np.array_equal(got["loss_mask"].numpy(), sample.loss_mask_T)
        streamed = [s["sample_id"] for s in reader.iter_samples()]
    assert streamed == [s.sample_id for items in shards for s, _ in items]


def test_shard_file_layout_and_metadata(tmp_path):
    items = make_items([3, 6, 2])
    entry = write_shard(tmp_path, 7, items, points=POINTS, metadata={"engine": "hf"})
    assert entry.name == "shard-00007" and entry.num_samples == 3 and entry.num_tokens == 11
    assert entry.num_loss_tokens == sum(int(s.loss_mask_T.sum()) for s, _ in items)
    assert sorted(entry.files) == ["shards/shard-00007.parquet", "shards/shard-00007.safetensors"]
    assert ShardEntry.from_dict(json.loads(json.dumps(entry.to_dict()))) == entry
    with safe_open(str(tmp_path / "shards/shard-00007.safetensors"), framework="pt") as f:
        meta = f.metadata()
        assert f.get_tensor("sample_offsets").tolist() == [0, 3, 9, 11]
        assert list(f.get_slice("hidden_states").get_shape()) == [11, 3, H]
    assert json.loads(meta["points"]) == POINTS and meta["format_version"] == layout.FORMAT_VERSION and meta["engine"] == "hf"
    rows = pq.read_table(tmp_path / "shards/shard-00007.parquet").to_pylist()
    assert [r["offset"] for r in rows] == [0, 3, 9] and [r["num_tokens"] for r in rows] == [3, 6, 2]
    assert rows[1]["token_digest"] == layout.token_digest(items[1][0].input_ids_T, items[1][0].loss_mask_T, 3)
    assert [r["truncated"] for r in rows] == [True, False, False] and rows[2]["row"] == 2


def test_fp8_storage_scales_each_row_and_reads_back_in_the_capture_dtype(tmp_path):
    items = make_items([4, 3], dtype=torch.bfloat16)
    hs = items[0][1].hidden_states_TPH
    hs[0, 0, 0] = 3000.0  # far beyond e4m3fn's 448: its own row's scale covers it, nothing clips
    hs[1, 1] = 0.0  # an all-zero row
    hs[2, 2] *= 1e-4  # a row far below e4m3fn's normal range without scaling
    entry = write_shard(tmp_path, 0, items, points=POINTS, storage_dtype="float8_e4m3fn")
    assert entry.dtype == "float8_e4m3fn" and entry.storage["scaling"] == "absmax_per_token_point"
    make_manifest(tmp_path, [entry])
    with RunReader(tmp_path) as reader, RunReader(tmp_path, decode=False) as raw:
        for sample, capture in items:
            x = capture.hidden_states_TPH.float()
            got, stored = reader[sample.sample_id]["hidden_states"], raw[sample.sample_id]
            assert got.dtype == torch.bfloat16 and stored["hidden_states"].dtype == torch.float8_e4m3fn
            amax = x.abs().amax(dim=-1)
            assert torch.equal(stored["hidden_scales"], torch.where(amax > 0, amax / 448, torch.ones_like(amax)))
            # e4m3: at most half a step of 3 mantissa bits (2^-4 relative), or half the smallest subnormal step of
            # the row's scale; then the bf16 rounding of the product (2^-8 relative)
            bound = 2 ** -4 * x.abs() + 2 ** -10 * stored["hidden_scales"].unsqueeze(-1) + 2 ** -8 * got.float().abs()
            assert ((got.float() - x).abs() <= bound).all(), sample.sample_id
    assert reader_value(tmp_path, items[0][0].sample_id)[0, 0, 0] == 3000.0
    assert (reader_value(tmp_path, items[0][0].sample_id)[1, 1] == 0).all()


def reader_value(run_dir, sample_id):
    with RunReader(run_dir) as reader:
        return reader[sample_id]["hidden_states"]


def test_fp8_storage_refuses_non_finite_states(tmp_path):
    items = make_items([2], dtype=torch.bfloat16)
    for bad in (float("inf"), float("nan")):
        items[0][1].hidden_states_TPH[1, 0, 3] = bad
        with pytest.raises(ValueError, match="non-finite hidden states cannot be stored in float8_e4m3fn"):
            write_shard(tmp_path, 0, items, points=POINTS, storage_dtype="float8_e4m3fn")


def test_write_shard_refuses_inconsistent_input(tmp_path):
    items = make_items([3, 2])
    with pytest.raises(ValueError, match="empty"):
        write_shard(tmp_path, 0, [], points=POINTS)
    with pytest.raises(ValueError, match="reserved"):
        write_shard(tmp_path, 0, items, points=POINTS, metadata={"points": "x"})
    with pytest.raises(ValueError, match="storage_dtype='int8'"):
        write_shard(tmp_path, 0, items, points=POINTS, storage_dtype="int8")
    with pytest.raises(ValueError, match=r"shape \(3, 3, 16\) != \(3, 2, 16\)"):
        write_shard(tmp_path, 0, items, points=POINTS[:2])
    empty = make_sample(5, 0)
    with pytest.raises(ValueError, match="num_tokens=0"):
        write_shard(tmp_path, 0, [(empty, make_capture(empty))], points=POINTS)
    mixed = [items[0], (items[1][0], make_capture(items[1][0], torch.bfloat16))]
    with pytest.raises(ValueError, match="dtype torch.bfloat16 != torch.float32"):
        write_shard(tmp_path, 0, mixed, points=POINTS)


# --- planning work units -----------------------------------------------------------------------------------------

def test_plan_units_is_deterministic_ordered_and_bounded():
    rng = np.random.default_rng(3)
    samples = [make_sample(i, int(n)) for i, n in enumerate(rng.integers(1, 40, 200))]
    samples.insert(50, make_sample(999, 150))  # longer than a whole shard
    units = plan_units(samples, max_tokens_per_shard=100, max_samples_per_shard=8)
    again = plan_units(list(samples), max_tokens_per_shard=100, max_samples_per_shard=8)
    assert [[s.sample_id for s in u] for u in units] == [[s.sample_id for s in u] for u in again]
    assert [s for u in units for s in u] == samples
    for unit in units:
        assert 1 <= len(unit) <= 8
        assert sum(s.num_tokens for s in unit) <= 100 or len(unit) == 1
    assert [s.sample_id for s in units[[u[0].row for u in units].index(999)]] == ["id-0-999"]


def test_plan_units_rejects_bad_limits():
    with pytest.raises(ValueError, match="max_tokens_per_shard=0"):
        plan_units([], max_tokens_per_shard=0, max_samples_per_shard=1)
    with pytest.raises(ValueError, match="max_samples_per_shard=-1"):
        plan_units([], max_tokens_per_shard=1, max_samples_per_shard=-1)
    assert plan_units([], max_tokens_per_shard=1, max_samples_per_shard=1) == []


# --- completion markers and resume ------------------------------------------------------------------------------

def test_completed_shard_resume_rules(tmp_path):
    assert completed_shard(tmp_path, 0) is None
    entry = write_shard(tmp_path, 0, make_items([3, 4]), points=POINTS)
    assert completed_shard(tmp_path, 0) == entry
    paths = layout.shard_paths(tmp_path, 0)
    with open(paths["safetensors"], "r+b") as f:  # a half-written data file under a marker
        f.truncate(entry.files["shards/shard-00000.safetensors"]["bytes"] - 1)
    assert completed_shard(tmp_path, 0) is None
    write_shard(tmp_path, 0, make_items([3, 4]), points=POINTS)  # rewrite over present files
    paths["marker"].write_text("{torn")
    assert completed_shard(tmp_path, 0) is None
    paths["marker"].unlink()
    assert completed_shard(tmp_path, 0) is None


def test_rewrite_removes_stale_temp_files_and_marker_first(tmp_path):
    paths = layout.shard_paths(tmp_path, 3)
    paths["safetensors"].parent.mkdir(parents=True)
    stale = paths["safetensors"].parent / ".shard-00003.safetensors.x1y2.tmp"
    stale.write_bytes(b"killed writer")
    paths["safetensors"].write_bytes(b"half a shard, no marker")
    entry = write_shard(tmp_path, 3, make_items([2]), points=POINTS)
    assert not stale.exists() and completed_shard(tmp_path, 3) == entry
    with pytest.raises(ValueError, match="non-finite"):  # fails halfway through the stream
        bad = make_items([2, 2])
        bad[1][1].hidden_states_TPH[0, 0, 0] = float("inf")
        write_shard(tmp_path, 3, bad, points=POINTS, storage_dtype="float8_e4m3fn")
    assert completed_shard(tmp_path, 3) is None  # the marker went first, so the shard counts as unfinished
    assert sorted(p.name for p in paths["safetensors"].parent.iterdir()) == [
        "shard-00003.parquet", "shard-00003.safetensors"]  # no temp file left behind
    assert paths["safetensors"].stat().st_size == entry.files["shards/shard-00003.safetensors"]["bytes"]


# --- manifest ----------------------------------------------------------------------------------------------------

def test_manifest_write_read_and_finished(tmp_path):
    assert not is_finished(tmp_path)
    with pytest.raises(ManifestError, match="unfinished run"):
        read_manifest(tmp_path)
    with pytest.raises(ManifestError, match="does not exist"):
        read_manifest(tmp_path / "nope")
    make_run(tmp_path, [[2, 3]])
    assert is_finished(tmp_path) and read_manifest(tmp_path)["num_tokens"] == 5
    text = (tmp_path / "manifest.json").read_text()
    assert text.index('"config"') < text.index('"dtype"') < text.index('"shards"')  # sorted keys
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ManifestError, match="manifest.json is not readable JSON"):
        read_manifest(tmp_path)
    with pytest.raises(ManifestError, match=r"missing required keys \['format_version'"):
        write_manifest(tmp_path, {"points": POINTS})


# --- validation at the boundary ---------------------------------------------------------------------------------

def _check(sample, capture):
    return check_capture(sample, capture, num_points=len(POINTS), hidden_size=H)


def test_validate_accepts_a_good_capture():
    sample = make_sample(0, 6)
    assert _check(sample, make_capture(sample)) is None
    assert capture_reject(sample, make_capture(sample), num_points=len(POINTS), hidden_size=H) is None


def test_validate_names_each_failure():
    sample = make_sample(0, 6)
    good = make_capture(sample)
    ids = sample.input_ids_T.copy()
    ids[4] = ids[4] + 1
    cases = {
        "sample_id_mismatch: capture 'other' vs prepared 'id-0-0'": Capture(
            sample_id="other", input_ids_T=good.input_ids_T, hidden_states_TPH=good.hidden_states_TPH),
        f"first at position 4: capture {ids[4]} vs prepared {sample.input_ids_T[4]}": Capture(
            sample_id=sample.sample_id, input_ids_T=ids, hidden_states_TPH=good.hidden_states_TPH),
        "length_mismatch: capture input_ids_T has 5 tokens, prepared sample has 6": Capture(
            sample_id=sample.sample_id, input_ids_T=ids[:5], hidden_states_TPH=good.hidden_states_TPH),
        "length_mismatch: hidden_states_TPH has 5 tokens, prepared sample has 6": Capture(
            sample_id=sample.sample_id, input_ids_T=good.input_ids_T, hidden_states_TPH=good.hidden_states_TPH[:5]),
        "shape (6, 2, 16) != expected [T, P, H] = (6, 3, 16)": Capture(
            sample_id=sample.sample_id, input_ids_T=good.input_ids_T, hidden_states_TPH=good.hidden_states_TPH[:, :2]),
        "shape (6, 3, 8) != expected": Capture(
            sample_id=sample.sample_id, input_ids_T=good.input_ids_T, hidden_states_TPH=good.hidden_states_TPH[..., :8]),
    }
    for expected, capture in cases.items():
        assert expected in str(_check(sample, capture))


def test_validate_counts_non_finite_values_per_point():
    sample = make_sample(0, 6)
    capture = make_capture(sample, torch.bfloat16)
    capture.hidden_states_TPH[2, 1, 3] = float("nan")
    capture.hidden_states_TPH[5, 1, 0] = float("nan")
    capture.hidden_states_TPH[0, 2, 7] = float("-inf")
    reason = str(_check(sample, capture))
    assert reason == "non_finite: hidden_states_TPH has 2 NaN and 1 inf value(s), at point index(es) [1, 2] of 3"
    reject = capture_reject(sample, capture, num_points=len(POINTS), hidden_size=H)
    assert (reject.reason, reject.detail, reject.sample_id, reject.row) == ("non_finite", reason, "id-0-0", 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf"), None])
def test_every_non_finite_value_is_found_wherever_it_is(dtype, bad):
    from pipeline.shards.validate import all_finite

    hs = torch.randn(257, 3, 64).to(dtype)
    hs[0, 0, 0], hs[-1, -1, -1] = torch.finfo(dtype).max, torch.finfo(dtype).min  # extremes are finite
    for flat in (0, 7777, hs.numel() - 1):
        probe = hs.clone()
        if bad is not None:
            probe.view(-1)[flat] = bad
        assert all_finite(probe) is (bad is None), (dtype, bad, flat)
    assert all_finite(hs[:0])


def test_finished_files_are_readable_as_open_would_have_made_them(tmp_path):
    import os
    import stat

    make_run(tmp_path, [[3, 4]])
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"shard-00000.safetensors", "shard-00000.parquet", "shard-00000.done.json",
                                       "manifest.json"}
    umask = os.umask(0)
    os.umask(umask)
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in files} == {p.name: 0o666 & ~umask for p in files}


def test_the_rounding_figure_is_the_relative_l2_of_the_dequantized_states():
    gen = torch.Generator().manual_seed(0)
    magnitudes = torch.logspace(-4, 3, 40).reshape(40, 1, 1)  # rows across seven orders of magnitude
    x = (torch.randn(40, 3, 64, generator=gen) * magnitudes).to(torch.bfloat16)
    storage = choose(x.dtype, "float8_e4m3fn")
    stored, scales = storage.encode(x)
    back, ref = stored.float() * scales.unsqueeze(-1), x.float()
    want = ((back - ref).norm(dim=(0, 2)) / ref.norm(dim=(0, 2))).tolist()
    assert rounding_rel_l2(x, storage) == pytest.approx(want, rel=1e-5)
    assert all(0.01 < v < 0.04 for v in want)  # e4m3's 3 mantissa bits, whatever the row's magnitude
    assert rounding_rel_l2(x, choose(x.dtype, None)) == [0.0, 0.0, 0.0]
