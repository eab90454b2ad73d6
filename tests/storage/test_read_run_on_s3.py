"""A finished run in a bucket is read as the same run on disk (RunReader on an `s3://` URL, against SeaweedFS): every
sample bit-identical, in bf16 and in fp8 storage, each read by ranges holding that sample's bytes and no more."""
from __future__ import annotations

import torch
import pytest

from pipeline.shards.manifest import ManifestError
from pipeline.shards.reader import RunReader
from pipeline.core.stores import open_store
from tests.helpers.seaweed import upload_run
from tests.helpers.shards import H, POINTS, make_run


@pytest.mark.parametrize("storage_dtype", [None, "float8_e4m3fn"])
def test_a_run_in_a_bucket_reads_as_the_same_run(storage_dtype, s3_url, tmp_path):
    run = tmp_path / "run"
    make_run(run, [[5, 9, 3], [7, 1]], dtype=torch.bfloat16, storage_dtype=storage_dtype)
    upload_run(run, s3_url)
    with RunReader(run) as local, RunReader(s3_url) as remote:
        assert remote.manifest == local.manifest and remote.sample_ids == local.sample_ids
        for sample_id in local.sample_ids:
            here, there = local[sample_id], remote[sample_id]
            assert there.keys() == here.keys()
            for key in ("hidden_states", "input_ids", "loss_mask"):
                assert there[key].dtype == here[key].dtype and torch.equal(there[key], here[key]), (sample_id, key)
            assert torch.equal(remote.hidden_states(sample_id, slice(1, 3)), local.hidden_states(sample_id, slice(1, 3)))
            assert torch.equal(remote.tokens(sample_id)["input_ids"], local.tokens(sample_id)["input_ids"])
    with RunReader(s3_url, decode=False) as raw:
        sample_id = raw.sample_ids[1]  # 9 tokens
        raw[sample_id]
        handle = raw._handles[raw.shard_of(sample_id)]
        states = 9 * len(POINTS) * H * (1 if storage_dtype else 2) + (9 * len(POINTS) * 4 if storage_dtype else 0)
        assert handle.bytes_read == states + 9 * 8 + 9, "a sample's read holds its own rows only"


def test_a_bucket_prefix_without_a_manifest_is_an_unfinished_run(s3_url, tmp_path):
    run = tmp_path / "run"
    make_run(run, [[4, 2]], dtype=torch.bfloat16)
    store = open_store(s3_url)
    for path in sorted(p for p in (run / "shards").iterdir()):
        store.upload(f"shards/{path.name}", path)
    with pytest.raises(ManifestError, match=rf"unfinished run: {s3_url}/manifest.json does not exist"):
        RunReader(s3_url)
