"""verify_run and `python -m pipeline.verify` on real run directories, each broken in one specific way."""
from __future__ import annotations

import json
import struct

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from pipeline.core.io import sha256_file
from pipeline.core.stfile import read_header
from pipeline.shards import layout
from pipeline.shards.st_library import header_disagreements, read_library_header
from pipeline.shards.verify import verify_run
from pipeline.shards.writer import write_shard
from tests.helpers.cli import cli
from tests.helpers.shards import POINTS, H, make_items, make_run

ST0 = "shards/shard-00000.safetensors"
PQ0 = "shards/shard-00000.parquet"


def _edit_manifest(run_dir, edit):
    manifest = json.loads((run_dir / "manifest.json").read_text())
    edit(manifest)
    (run_dir / "manifest.json").write_text(json.dumps(manifest))


def _refresh_file_record(run_dir, rel):
    """After tampering with a file, make the manifest agree with it, so only deeper checks can catch the change."""
    def edit(manifest):
        for shard in manifest["shards"]:
            if rel in shard["files"]:
                shard["files"][rel] = {"sha256": sha256_file(run_dir / rel), "bytes": (run_dir / rel).stat().st_size}
    _edit_manifest(run_dir, edit)


def test_a_sound_run_has_no_problems(tmp_path):
    make_run(tmp_path, [[3, 5], [2], [7, 1, 1]], dtype=torch.bfloat16)
    assert verify_run(tmp_path) == []


def test_fp8_run_is_sound(tmp_path):
    make_run(tmp_path, [[3, 5], [2]], dtype=torch.bfloat16, storage_dtype="float8_e4m3fn")
    assert verify_run(tmp_path) == []


def test_flipped_byte_is_caught_by_sha(tmp_path):
    make_run(tmp_path, [[3, 5]])
    path = tmp_path / ST0
    data = bytearray(path.read_bytes())
    data[-20] ^= 0x01
    path.write_bytes(bytes(data))
    problems = verify_run(tmp_path)
    assert len(problems) == 1 and problems[0].startswith(f"shard-00000: {ST0} sha256 ")


def test_missing_shard(tmp_path):
    make_run(tmp_path, [[3], [4]])
    (tmp_path / "shards/shard-00001.safetensors").unlink()
    assert verify_run(tmp_path) == ["shard-00001: listed file shards/shard-00001.safetensors is missing"]


def test_nan_is_caught_by_the_finiteness_scan_alone(tmp_path):
    items = make_run(tmp_path, [[3, 5]], dtype=torch.bfloat16)
    infos, _ = read_header(tmp_path / ST0)
    hidden = infos[layout.HIDDEN_STATES]
    token, point, channel = 4, 2, 5  # token 4 is the second sample's token 1
    pos = hidden.start + ((token * len(POINTS) + point) * H + channel) * 2
    with open(tmp_path / ST0, "r+b") as f:
        f.seek(pos)
        f.write(torch.tensor([float("nan")], dtype=torch.bfloat16).view(torch.uint8).numpy().tobytes())
    _refresh_file_record(tmp_path, ST0)
    second = items[0][1][0].sample_id
    assert verify_run(tmp_path) == [
        f"shard-00000: 1 non-finite hidden state value(s), first at token 4 (sample {second!r}, point 'final_norm')"]


def test_nan_written_by_bypassing_validation(tmp_path):
    items = make_items([2, 3])
    items[1][1].hidden_states_TPH[0, 0, 0] = float("inf")
    entry = write_shard(tmp_path, 0, items, points=POINTS)  # the writer trusts validate.py; here nothing ran it
    from pipeline.shards.manifest import write_manifest
    write_manifest(tmp_path, {"format_version": layout.FORMAT_VERSION, "points": POINTS, "hidden_size": H,
                              "dtype": "float32", "shards": [entry.to_dict()], "num_samples": 2, "num_tokens": 5,
                              "num_loss_tokens": entry.num_loss_tokens, "storage": entry.storage})
    assert verify_run(tmp_path) == [f"shard-00000: 1 non-finite hidden state value(s), first at token 2 "
                                    f"(sample {items[1][0].sample_id!r}, point 'b0')"]


def test_count_mismatch(tmp_path):
    make_run(tmp_path, [[3, 5], [2]])
    _edit_manifest(tmp_path, lambda m: m.update(num_samples=4))
    assert verify_run(tmp_path) == ["manifest num_samples=4 but its shards hold 3"]
    _edit_manifest(tmp_path, lambda m: (m.update(num_samples=3), m["shards"][1].update(num_tokens=3)))
    problems = verify_run(tmp_path)
    assert "shard-00001: hidden_states shape [2, 3, 16] != expected [3, 3, 16] from manifest" in problems
    assert "manifest num_tokens=10 but its shards hold 11" in problems


def test_extra_file(tmp_path):
    make_run(tmp_path, [[3]])
    (tmp_path / "shards/shard-00009.safetensors").write_bytes(b"stray")
    assert verify_run(tmp_path) == ["unlisted file shards/shard-00009.safetensors in shards/"]


def test_duplicate_sample_ids_across_shards(tmp_path):
    make_run(tmp_path, [[3, 5]])
    entry2 = write_shard(tmp_path, 1, make_items([3]), points=POINTS)  # seed 0 again: same ids as shard 0
    _edit_manifest(tmp_path, lambda m: (m["shards"].append(entry2.to_dict()), m.update(
        num_samples=3, num_tokens=11, num_loss_tokens=m["num_loss_tokens"] + entry2.num_loss_tokens)))
    assert verify_run(tmp_path) == ["sample_id 'id-0-0' appears 2 times (in shard-00000, shard-00001)"]


def test_parquet_rows_must_agree_with_the_tensors(tmp_path):
    make_run(tmp_path, [[3, 5]])
    table = pq.read_table(tmp_path / PQ0)
    digests = table["token_digest"].to_pylist()
    table = table.set_column(table.schema.get_field_index("token_digest"), "token_digest",
                             pa.array([digests[0], "0" * 64]))
    pq.write_table(table, tmp_path / PQ0)
    _refresh_file_record(tmp_path, PQ0)
    problems = verify_run(tmp_path)
    assert len(problems) == 1 and problems[0].startswith("shard-00000: token_digest of sample 'id-0-1' (row 1) is 000")


def test_manifest_points_must_match_the_shards(tmp_path):
    make_run(tmp_path, [[3]])
    _edit_manifest(tmp_path, lambda m: (m.update(points=["b0", "b1", "final_norm"]),
                                        m["shards"][0].update(points=["b0", "b1", "final_norm"])))
    assert verify_run(tmp_path) == [
        "shard-00000: metadata points ['b0', 'b2', 'final_norm'] != manifest points ['b0', 'b1', 'final_norm']"]


def _cli(*args):
    return cli("pipeline.verify", *map(str, args), timeout=120)


def test_cli_exit_codes(tmp_path):
    run = tmp_path / "run"
    make_run(run, [[3, 5], [2]])
    ok = _cli(run)
    assert ok.returncode == 0 and ok.stdout.startswith("sound: ") and "3 samples, 10 tokens" in ok.stdout
    (run / "shards/extra.bin").write_bytes(b"x")
    bad = _cli(run)
    assert bad.returncode == 3 and "unlisted file shards/extra.bin in shards/" in bad.stderr
    missing = _cli(tmp_path / "nowhere")
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    (tmp_path / "half").mkdir()
    unfinished = _cli(tmp_path / "half")
    assert unfinished.returncode == 2 and "unfinished run" in unfinished.stderr


def test_fp8_nan_and_a_torn_header_are_reported(tmp_path):
    make_run(tmp_path, [[3, 5]], dtype=torch.bfloat16, storage_dtype="float8_e4m3fn")
    hidden = read_header(tmp_path / ST0)[0][layout.HIDDEN_STATES]
    with open(tmp_path / ST0, "r+b") as f:
        f.seek(hidden.start + 7)  # token 0, point 0, channel 7
        f.write(b"\x7f")  # e4m3fn's NaN
    _refresh_file_record(tmp_path, ST0)
    assert verify_run(tmp_path) == [
        "shard-00000: 1 non-finite hidden state value(s), first at token 0 (sample 'id-0-0', point 'b0')"]
    with open(tmp_path / ST0, "r+b") as f:
        f.seek(9)
        f.write(b"\x00")  # inside the JSON header
    _refresh_file_record(tmp_path, ST0)
    problems = verify_run(tmp_path)
    assert len(problems) == 1 and "shard-00000: unreadable (ValueError: shard-00000.safetensors: header is not" \
        in problems[0]


def _write_scale(run_dir, index, value):
    scales = read_header(run_dir / ST0)[0][layout.HIDDEN_SCALES]
    with open(run_dir / ST0, "r+b") as f:
        f.seek(scales.start + 4 * index)
        f.write(torch.tensor([value], dtype=torch.float32).numpy().tobytes())
    _refresh_file_record(run_dir, ST0)


def test_fp8_scales_must_be_finite_and_positive(tmp_path):
    make_run(tmp_path, [[3, 5]], dtype=torch.bfloat16, storage_dtype="float8_e4m3fn")
    token, point = 1, 2
    for bad in (0.0, -1.0):
        _write_scale(tmp_path, token * len(POINTS) + point, bad)
        assert verify_run(tmp_path) == [f"shard-00000: 1 hidden_scales value(s) not finite and positive, first at "
                                        f"token {token}, point index {point}: {bad!r}"]
    _write_scale(tmp_path, token * len(POINTS) + point, float("nan"))  # and every value of its row reads as NaN
    assert verify_run(tmp_path) == [
        f"shard-00000: 1 hidden_scales value(s) not finite and positive, first at token {token}, point index {point}: "
        f"nan", f"shard-00000: {H} non-finite hidden state value(s), first at token {token} (sample 'id-0-0', point "
        f"'{POINTS[point]}')"]
    _write_scale(tmp_path, token * len(POINTS) + point, 3e38)  # finite, but the dequantized row overflows bf16
    problems = verify_run(tmp_path)
    assert len(problems) == 1 and "non-finite hidden state value(s), first at token 1" in problems[0], problems


def test_fp8_storage_records_must_agree(tmp_path):
    make_run(tmp_path, [[3, 5], [2]], dtype=torch.bfloat16, storage_dtype="float8_e4m3fn")

    def storage(**changes):
        _edit_manifest(tmp_path, lambda m: m["storage"].update(changes))

    storage(scaling="none")
    assert verify_run(tmp_path) == ["manifest storage: storage dtype='float8_e4m3fn' with scaling='none' from capture "
                                    "dtype 'bfloat16' is not a storage this pipeline writes (the capture dtype with "
                                    "scaling 'none', or float8_e4m3fn with scaling 'absmax_per_token_point')"]
    storage(scaling="absmax_per_token_point", capture_dtype="float16")  # the shards say bfloat16
    problems = verify_run(tmp_path)
    assert len(problems) == 4 and all("!= manifest storage" in p for p in problems), problems
    assert problems[0].startswith("shard-00000: storage {'dtype': 'float8_e4m3fn', 'capture_dtype': 'bfloat16'")
    assert problems[1].startswith("shard-00001: storage") and problems[2].startswith("shard-00000: metadata storage")
    storage(capture_dtype="bfloat16")
    assert verify_run(tmp_path) == []
    _edit_manifest(tmp_path, lambda m: m.pop("storage"))  # fp8 states and no record of their scales
    assert len(verify_run(tmp_path)) == 1 and "format_version 3 requires ['storage']" in verify_run(tmp_path)[0]


def test_plain_run_claiming_fp8_storage(tmp_path):
    make_run(tmp_path, [[3]], dtype=torch.bfloat16)
    _edit_manifest(tmp_path, lambda m: m["storage"].update(dtype="float8_e4m3fn", scaling="absmax_per_token_point"))
    assert verify_run(tmp_path) == ["manifest storage dtype 'float8_e4m3fn' != manifest dtype 'bfloat16'"]


def _as_format_1_before_storage(run_dir):
    """The run as format 1 wrote it before storage was recorded: no storage record in the manifest, its entries or the
    shards' metadata, `num_saturated` in every entry, format_version "1" everywhere, token digests of the ids alone
    (the files' records refreshed)."""
    for path in sorted((run_dir / "shards").glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            tensors = {name: f.get_tensor(name) for name in f.keys()}
            meta = {**f.metadata(), layout.META_FORMAT_VERSION: "1"}
        meta.pop(layout.META_STORAGE)
        save_file(tensors, str(path), metadata=meta)
        _refresh_file_record(run_dir, path.relative_to(run_dir).as_posix())
        rows = path.with_suffix(".parquet")
        table, ids, offsets = pq.read_table(rows), tensors[layout.INPUT_IDS].numpy(), tensors[layout.SAMPLE_OFFSETS]
        digests = [layout.ids_digest(ids[a:b]) for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]
        pq.write_table(table.set_column(table.schema.get_field_index("token_digest"), "token_digest",
                                        pa.array(digests)), rows)
        _refresh_file_record(run_dir, rows.relative_to(run_dir).as_posix())

    def legacy(manifest):
        manifest.pop("storage")
        manifest["format_version"] = "1"
        for shard in manifest["shards"]:
            shard.pop("storage")
            shard["num_saturated"] = 0
    _edit_manifest(run_dir, legacy)


def test_a_run_written_before_storage_was_recorded_still_verifies(tmp_path):
    make_run(tmp_path, [[3, 5]], dtype=torch.bfloat16)
    _as_format_1_before_storage(tmp_path)
    assert verify_run(tmp_path) == []
    _edit_manifest(tmp_path, lambda m: m.update(format_version="2"))  # what version 1 lacked, version 2 requires
    assert "format_version 2 requires ['storage']" in verify_run(tmp_path)[0]


def _json(header):
    return json.dumps(header, separators=(",", ":")).encode()


def _gap_before_loss_mask(header, data):
    begin, end = header[layout.LOSS_MASK]["data_offsets"]
    header[layout.LOSS_MASK]["data_offsets"] = [begin + 8, end + 8]
    return _json(header), data[:begin] + bytes(8) + data[begin:]


# Shards the pipeline's own parser reads (and whose values are all right) but the safetensors library refuses, and
# its reason. edit(header, data) -> (header JSON, data); the header is re-padded to 8 bytes as the writer pads it.
LIBRARY_REFUSES = {
    "bytes after the last tensor": (lambda h, d: (_json(h), d + bytes(8)), "file not fully covered"),
    "a gap between two tensors": (_gap_before_loss_mask, "invalid offset for tensor `loss_mask`"),
    "a UTF-8 BOM before the JSON": (lambda h, d: (b"\xef\xbb\xbf" + _json(h), d), "invalid JSON in header"),
    "a metadata value that is not a string": (
        lambda h, d: (_json({**h, "__metadata__": {**h["__metadata__"], "note": 1}}), d), "expected a string"),
}


@pytest.mark.parametrize("case", list(LIBRARY_REFUSES))
def test_a_shard_only_the_hand_written_parser_reads_is_named(tmp_path, case):
    make_run(tmp_path, [[3, 5]], dtype=torch.bfloat16)
    edit, reason = LIBRARY_REFUSES[case]
    raw = (tmp_path / ST0).read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header, data = edit(json.loads(raw[8:8 + length]), raw[8 + length:])
    header += b" " * (-(8 + len(header)) % 8)
    (tmp_path / ST0).write_bytes(struct.pack("<Q", len(header)) + header + data)
    _refresh_file_record(tmp_path, ST0)
    read_header(tmp_path / ST0)  # the writer's parser accepts it: only a second reader can tell
    problems = verify_run(tmp_path)
    assert len(problems) == 1 and problems[0].startswith(
        "shard-00000: the safetensors library rejects shard-00000.safetensors (") and reason in problems[0], problems
    assert problems[0].endswith("), though the pipeline's own parser reads it")


def test_the_two_parsers_agree_on_a_sound_shard_and_a_disagreement_is_named(tmp_path):
    make_run(tmp_path, [[3]])
    infos, meta = read_header(tmp_path / ST0)
    library = read_library_header(tmp_path / ST0)
    assert header_disagreements("s", infos, meta, library) == []
    library.tensors[layout.LOSS_MASK] = ("BOOL", (3,))
    library.metadata["engine"] = "other"
    assert header_disagreements("s", infos, meta, library) == [
        "s: loss_mask is U8 [3] to the pipeline's parser, BOOL [3] to the safetensors library",
        "s: metadata ['engine'] read differently by the pipeline's parser and the safetensors library"]
