"""Compressed data files read as users expect: recognised by content (not by name), decompressed by pyarrow, giving
the very samples (ids included) of the plain file; a stream that does not decompress is one clear line."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from transformers import AutoTokenizer

from pipeline.data.prepare import prepare
from pipeline.data.sources import check_readable
from pipeline.factory.tokenizer import bundled_conversations_path

pytestmark = pytest.mark.reliability
REPO = Path(__file__).resolve().parents[2]
BAD = ["{not json", json.dumps({"messages": [{"role": "user", "content": "no answer"}]})]


@pytest.fixture(scope="module")
def tok(tiny_model):
    return AutoTokenizer.from_pretrained(str(tiny_model("tiny-kimi-int4")))


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> Path:
    """The bundled conversations with two bad records among them, as plain JSONL."""
    lines = bundled_conversations_path().read_text().splitlines()[:20]
    path = tmp_path_factory.mktemp("plain") / "data.jsonl"
    path.write_text("\n".join(lines[:3] + BAD + lines[3:]) + "\n")
    return path


def _zstd(data: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(data)


def _prepared(path: Path, tok):
    data = prepare(path, tok, max_length=64, length_policy="truncate")
    samples = [(s.sample_id, s.row, s.input_ids_T.tolist(), s.loss_mask_T.tolist(), s.truncated) for s in data.samples]
    rejects = [(r.sample_id, r.row, r.reason, r.detail) for r in data.rejects]
    return samples, rejects


@pytest.mark.parametrize("name, encode", [
    ("data.jsonl.gz", gzip.compress),
    ("data.jsonl.zst", _zstd),
    ("gzip-inside.jsonl", gzip.compress),  # the name says plain, the content is gzip
    ("plain-inside.jsonl.gz", lambda data: data),  # the name says gzip, the content is plain
])
def test_compressed_jsonl_gives_the_plain_files_samples(tmp_path, tok, plain, name, encode):
    path = tmp_path / name
    path.write_bytes(encode(plain.read_bytes()))
    check_readable(path)
    samples, rejects = _prepared(path, tok)
    want_samples, want_rejects = _prepared(plain, tok)
    assert samples == want_samples and rejects == want_rejects
    assert len(samples) == 20 and any(s[-1] for s in samples)
    assert [r[2] for r in rejects] == ["malformed_json", "no_assistant_turn"]


@pytest.mark.parametrize("suffix", [".json", ".parquet"])
def test_compressed_json_and_parquet_give_the_plain_files_samples(tmp_path, tok, plain, suffix):
    records = [json.loads(line) for line in plain.read_text().splitlines() if not line.startswith("{not")]
    original = tmp_path / f"data{suffix}"
    if suffix == ".json":
        original.write_text(json.dumps(records))
    else:
        pq.write_table(pa.Table.from_pylist(records), original)
    for compressed, encode in ((f"data{suffix}.gz", gzip.compress), (f"data{suffix}.zst", _zstd)):
        path = tmp_path / compressed
        path.write_bytes(encode(original.read_bytes()))
        check_readable(path)
        assert _prepared(path, tok) == _prepared(original, tok)


def test_gzip_whose_content_is_not_records_is_rejected_record_by_record(tmp_path, tok):
    path = tmp_path / "binary.jsonl.gz"
    path.write_bytes(gzip.compress(np.random.default_rng(0).bytes(4000)))
    check_readable(path)
    data = prepare(path, tok, max_length=64, length_policy="truncate")
    assert data.samples == [] and data.rejects
    assert {r.reason for r in data.rejects} == {"malformed_json"}
    assert all(r.detail.startswith("line ") for r in data.rejects)


def test_a_gzip_file_cut_short_is_one_line_naming_it(tmp_path, tok, plain):
    """Cut after the first MiB the start-up check reads: the error comes from preparation, as one ValueError line."""
    whole = gzip.compress(plain.read_bytes() * 400)  # several MiB of text
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(whole[: len(whole) * 3 // 4])
    check_readable(path)
    with pytest.raises(ValueError) as error:
        prepare(path, tok, max_length=64, length_policy="truncate")
    assert str(error.value) == (f"{path} is not valid gzip data (Truncated compressed stream): the file is corrupt or "
                                "was cut short")


def test_a_corrupt_gzip_stops_extract_at_start_up(tmp_path):
    path = tmp_path / "corrupt.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"text": "hello"}\n' * 100)[:10] + b"\x00garbage, not deflate" * 8)
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "pipeline.extract", f"out_dir={out}", f"data.path={path}",
                           f"hydra.run.dir={tmp_path / 'logs'}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in output, output[-3000:]
    (error,) = [line for line in output.splitlines() if "[ERROR]" in line]
    assert f"configuration error: data.path='{path}': {path} is not valid gzip data (" in error
    assert error.endswith("the file is corrupt or was cut short")
    assert not out.exists()
