"""The storage interface (pipeline/core/storage.py) holds the same guarantees on the local file system and on a real S3
server (SeaweedFS on loopback): create-only writes with one winner, writes conditional on a version, ranged reads,
large files as verified multipart uploads resumed after kill -9, and the uploads a killed writer left listed and
aborted."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pipeline.core import s3 as s3mod
from pipeline.core import storage
from pipeline.core.local_store import LocalStore
from pipeline.core.storage import Exists, Stale, StorageError, StorageFailed
from pipeline.core.stores import open_store

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    return open_store(request.getfixturevalue("s3_url"))


def test_create_only_write_refuses_an_existing_key(store):
    store.put("run/manifest.json", b"first", create=True)
    with pytest.raises(Exists):
        store.put("run/manifest.json", b"second", create=True)
    assert store.get("run/manifest.json") == b"first"


def test_of_racing_create_only_writes_exactly_one_wins(store):
    winners, start = [], threading.Barrier(8)

    def race(i: int) -> None:
        start.wait()
        try:
            store.put("lease", f"writer {i}".encode(), create=True)
            winners.append(i)
        except Exists:
            pass

    threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1
    assert store.get("lease") == f"writer {winners[0]}".encode()


def test_conditional_writes_and_deletes_name_one_version(store):
    first = store.put("lease", b"a")
    second = store.put("lease", b"b", match=first)
    assert second != first and store.head("lease").etag == second
    with pytest.raises(Stale):
        store.put("lease", b"c", match=first)
    with pytest.raises(Stale):
        store.delete("lease", match=first)
    assert store.get("lease") == b"b"
    store.delete("lease", match=second)
    assert store.head("lease") is None
    with pytest.raises(Stale):
        store.put("lease", b"d", match=second)  # a version of an object that is gone


def test_ranged_reads_and_listing(store):
    data = bytes(range(256)) * 64
    store.put("shards/shard-00000.safetensors", data)
    store.put("shards/shard-00001.safetensors", b"x")
    store.put("manifest.json", b"{}")
    assert store.get("shards/shard-00000.safetensors", 1000, 1010) == data[1000:1010]
    assert store.get("shards/shard-00000.safetensors", 16000) == data[16000:]
    assert store.get("shards/shard-00000.safetensors", 5, 5) == b""
    assert store.get("shards/shard-00000.safetensors", len(data), len(data) + 10) == b""  # past the end, as a file
    assert store.get("shards/shard-00000.safetensors", len(data) - 2, len(data) + 10) == data[-2:]
    listed = {o.key: o.size for o in store.list("shards/")}
    assert listed == {"shards/shard-00000.safetensors": len(data), "shards/shard-00001.safetensors": 1}
    assert [o.key for o in store.list()] == ["manifest.json", *sorted(listed)]


@pytest.mark.parametrize("size", [0, 1000, 4096, 4096 * 5 + 7])
def test_an_object_is_copied_to_a_file_by_ranges_read_at_once(store, tmp_path, monkeypatch, size):
    """`download` reads an object in CHUNK_BYTES ranges, several at once, each written at its offset: the file is the
    object's bytes whether it is empty, one range, exactly one range, or ranges and a part of one."""
    monkeypatch.setattr(storage, "CHUNK_BYTES", 4096)
    data = os.urandom(size)
    store.put("shards/big.safetensors", data)
    storage.download(store, "shards/big.safetensors", tmp_path / "copy" / "big.safetensors", size)
    assert (tmp_path / "copy" / "big.safetensors").read_bytes() == data


@pytest.mark.parametrize("listed", [1000 - 1, 1000 + 1, 4096 * 3 - 5, 4096 * 3 + 5])
def test_an_object_replaced_since_it_was_listed_is_not_copied_short_or_cut(store, tmp_path, monkeypatch, listed):
    """The size `download` was told (the listing's) and the object's differ: a failure naming the object, never a
    file holding a part of it (or a hole of zeros where the ranges ran past its end)."""
    monkeypatch.setattr(storage, "CHUNK_BYTES", 4096)
    actual = 1000 if listed < 2000 else 4096 * 3
    store.put("data/prompts.jsonl", os.urandom(actual))
    with pytest.raises(StorageFailed, match=r"data/prompts\.jsonl: (more|fewer) bytes than the .* changed while it"):
        storage.download(store, "data/prompts.jsonl", tmp_path / "copy.jsonl", listed)


def _file(path: Path, size: int) -> str:
    block = hashlib.sha256(b"seed").digest() * (1 << 15)  # 1 MiB of bytes no part repeats by accident
    with open(path, "wb") as f:
        for i in range(size // len(block) + 1):
            f.write(hashlib.sha256(str(i).encode()).digest() + block[32:])
        f.truncate(size)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_large_file_is_a_create_only_multipart_upload(s3_url, tmp_path, monkeypatch):
    monkeypatch.setattr(s3mod, "PART_BYTES", 5 << 20)  # S3's smallest part: three parts for 13 MiB
    src = tmp_path / "shard-00000.safetensors"
    digest = _file(src, (13 << 20) + 7)
    store = open_store(s3_url)
    info = store.upload("shards/shard-00000.safetensors", src)
    assert info.size == src.stat().st_size and info.etag.endswith('-3"')
    assert hashlib.sha256(store.get("shards/shard-00000.safetensors")).hexdigest() == digest
    with pytest.raises(Exists):
        store.upload("shards/shard-00000.safetensors", src)
    assert store.unfinished() == []  # the refused upload was aborted, not left behind


_UPLOAD = """
import sys
from pathlib import Path
from pipeline.core import s3
from pipeline.core.stores import open_store
s3.PART_BYTES, s3.UPLOAD_THREADS = 5 << 20, 1
open_store(sys.argv[1]).upload("shards/big.bin", Path(sys.argv[2]))
"""


def _upload(url: str, src: Path, trace: Path, fault: str | None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PIPELINE_FAULT_TRACE": str(trace)}
    env.pop("PIPELINE_FAULT", None)
    if fault:
        env["PIPELINE_FAULT"] = fault
    return subprocess.run([sys.executable, "-c", _UPLOAD, url, str(src)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)


def test_an_upload_killed_mid_way_resumes_from_its_finished_parts(s3_url, tmp_path):
    src = tmp_path / "big.bin"
    digest = _file(src, (21 << 20) + 3)  # five parts of 5 MiB
    first, second = tmp_path / "first.trace", tmp_path / "second.trace"
    killed = _upload(s3_url, src, first, "kill@part:big.bin#3")
    assert killed.returncode == -9, killed.stderr
    store = open_store(s3_url)
    assert store.head("shards/big.bin") is None  # nothing visible under the final name
    assert store.unfinished() == ["shards/big.bin"]
    done = _upload(s3_url, src, second, None)
    assert done.returncode == 0, done.stderr
    parts = second.read_text().splitlines().count("part:big.bin")
    assert parts == 2, f"the resumed upload sent {parts} parts; the first three were finished"
    assert hashlib.sha256(store.get("shards/big.bin")).hexdigest() == digest
    assert store.unfinished() == []


def test_abandoned_uploads_are_listed_and_aborted(s3_url, tmp_path):
    src = tmp_path / "big.bin"
    _file(src, (11 << 20))
    assert _upload(s3_url, src, tmp_path / "t", "kill@part:big.bin#1").returncode == -9
    store = open_store(s3_url)
    assert store.abort_unfinished("shards/") == ["shards/big.bin"]
    assert store.unfinished() == []


def _refusal(url: str) -> str:
    with pytest.raises(StorageError) as caught:
        open_store(url).check()
    return str(caught.value)


def test_bad_locations_are_refused_in_one_line_without_credentials(s3_env, monkeypatch):
    secret, key_id = s3_env.env["AWS_SECRET_ACCESS_KEY"], s3_env.env["AWS_ACCESS_KEY_ID"]
    lines = {"no bucket": _refusal("s3://no-such-bucket/r1")}
    assert "the bucket 'no-such-bucket' does not exist" in lines["no bucket"]
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-" + secret)
    lines["wrong secret"] = _refusal(s3_env.url("r1"))
    assert "refused the credentials" in lines["wrong secret"]
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    with socket_closed() as port:
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{key_id}:{secret}@127.0.0.1:{port}")
        lines["refusing endpoint"] = _refusal(s3_env.url("r1"))
    assert f"http://127.0.0.1:{port} does not answer" in lines["refusing endpoint"]
    with pytest.raises(StorageError, match="'gs' is not supported"):
        open_store("gs://bucket/r1")
    for what, line in lines.items():
        assert "\n" not in line and s3_env.bucket in line or "no-such-bucket" in line, (what, line)
        assert secret not in line and key_id not in line, (what, line)


def test_credentials_written_into_a_url_or_endpoint_are_never_echoed(s3_env, monkeypatch):
    with pytest.raises(StorageError) as in_url:
        open_store("s3://AKIAEXAMPLE:hush-hush@runs/r1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://someone:hush-hush@bad_host!:9000")
    with pytest.raises(StorageError) as in_endpoint:
        open_store(s3_env.url("r1"))
    for caught in (in_url, in_endpoint):
        assert "hush-hush" not in str(caught.value) and "AKIAEXAMPLE" not in str(caught.value), str(caught.value)
    assert "credentials do not go in the URL" in str(in_url.value)
    assert "http://bad_host!:9000 is not a valid URL" in str(in_endpoint.value) or "not a valid URL" in \
        str(in_endpoint.value)


def test_a_missing_bucket_is_named_even_by_a_head(s3_env):
    with pytest.raises(StorageError, match="the bucket 'no-such-bucket' does not exist"):
        open_store("s3://no-such-bucket/r1").head("manifest.json")  # a HEAD's 404 carries no error code


def test_a_url_already_read_as_a_path_is_refused():
    with pytest.raises(StorageError, match="is a URL read as a path"):
        open_store(Path("s3://runs/r1"))


class socket_closed:
    """A loopback port nothing listens on."""

    def __enter__(self) -> int:
        import socket
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        return self.port

    def __exit__(self, *exc: object) -> None:
        pass
