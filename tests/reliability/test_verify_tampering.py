"""`python -m pipeline.verify` on a real finished run, tampered with in every way issues #16 and #24 found unchecked:
each kind is exit status 3 and one stderr line naming the file and what is wrong; the untampered run verifies sound.

One real run per module (the HF engine on the tiny Kimi target, gate off, a zstd-compressed data file with two bad
records, truncation to 96 tokens, its attestation signed with `sign_key`), copied for each case. It also shows
truncation counted in the manifest and in extract's summary, and a compressed input read end to end. A forger here
rewrites every checksum and the attestation as the pipeline's own code writes them, only without the key
(`forge_records`): the unsigned verify cannot tell, `--key PUB` can.
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from safetensors import safe_open
from safetensors.torch import save_file

from pipeline.core.io import sha256_file
from pipeline.factory.tokenizer import bundled_conversations_path
from pipeline.provenance import digest
from pipeline.shards import attestation
from pipeline.shards.manifest import manifest_text
from pipeline.shards.reader import RunReader
from pipeline.shards.signing_keys import keyid, load_public_key
from pipeline.verify import main as verify_main

pytestmark = pytest.mark.reliability
REPO = Path(__file__).resolve().parents[2]
BAD_RECORDS = ["{not json", json.dumps({"messages": [{"role": "user", "content": "hi"}]})]  # 2 rejects, 2 reasons
RUN = ("gate.mode=off", "data.limit=8", "runner.max_samples_per_shard=4", "data.max_length=96")
ST0, ST1 = "shards/shard-00000.safetensors", "shards/shard-00001.safetensors"


def cli(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


def write_key_pair(folder: Path, name: str) -> tuple[Path, Path]:
    """An Ed25519 key pair as `openssl genpkey -algorithm ed25519` and `openssl pkey -pubout` write them."""
    private = Ed25519PrivateKey.generate()
    pem, pub = folder / f"{name}.pem", folder / f"{name}.pub"
    pem.write_bytes(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    pub.write_bytes(private.public_key().public_bytes(serialization.Encoding.PEM,
                                                      serialization.PublicFormat.SubjectPublicKeyInfo))
    return pem, pub


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keys")
    return {"signer": write_key_pair(folder, "signer"), "other": write_key_pair(folder, "other")}


@pytest.fixture(scope="module")
def finished(tmp_path_factory, models_root, keys):
    root = tmp_path_factory.mktemp("tamper")
    lines = BAD_RECORDS + bundled_conversations_path().read_text().splitlines()[:12]
    data = root / "conversations.jsonl.zst"
    data.write_bytes(zstandard.ZstdCompressor().compress(("\n".join(lines) + "\n").encode()))
    proc = cli("pipeline.extract", f"out_dir={root / 'run'}", f"data.path={data}", *RUN,
               f"hydra.run.dir={root / 'logs'}", f"sign_key={keys['signer'][0]}")
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    return root / "run", proc


@pytest.fixture
def run(finished, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(finished[0], copy, symlinks=True)
    return copy


def verify(run_dir: Path, capsys, *key: str | Path) -> tuple[int, list[str]]:
    """verify's exit status and its stderr lines (the entry point itself, in this process); `key`: ("--key", PUB)."""
    capsys.readouterr()
    status = verify_main([str(run_dir), *map(str, key)])
    return status, capsys.readouterr().err.splitlines()


def forge_records(run_dir: Path, *, signatures: str = "none") -> None:
    """What a forger without the key does after changing files: every shard file's sha256 and size in the manifest
    and the markers recomputed, and the attestation rewritten over the files as they are now, by the pipeline's own
    code, its signature list empty (`signatures="none"`) or the run's original signature kept ("kept")."""
    manifest = json.loads((run_dir / "manifest.json").read_text())
    for entry in manifest["shards"]:
        for rel in entry["files"]:
            entry["files"][rel] = {"sha256": sha256_file(run_dir / rel), "bytes": (run_dir / rel).stat().st_size}
        (run_dir / "shards" / f"{entry['name']}.done.json").write_text(json.dumps(entry, indent=2, sort_keys=True))
    text = manifest_text(manifest)
    (run_dir / "manifest.json").write_text(text)
    original = json.loads((run_dir / attestation.NAME).read_text())["signatures"]
    attestation.write(run_dir, manifest, text)
    if signatures == "kept":
        forged = json.loads((run_dir / attestation.NAME).read_text())
        (run_dir / attestation.NAME).write_text(json.dumps({**forged, "signatures": original}))


def shard_tensors(path: Path) -> tuple[dict, dict]:
    with safe_open(str(path), "pt") as f:
        return {name: f.get_tensor(name) for name in f.keys()}, f.metadata()


def edit_manifest(run_dir: Path, edit) -> dict:
    manifest = json.loads((run_dir / "manifest.json").read_text())
    edit(manifest)
    (run_dir / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return manifest


def relist(run_dir: Path, index: int, old: str, new: str) -> None:
    """List shard `index`'s file `old` under the path `new` (size and sha256 kept: only the path is wrong)."""
    def edit(manifest):
        files = manifest["shards"][index]["files"]
        files[new] = files.pop(old)
    edit_manifest(run_dir, edit)


def test_the_untampered_run_is_sound_and_counts_what_it_read(finished, capsys, keys):
    out, proc = finished
    status, errors = verify(out, capsys)
    assert status == 0 and errors == []
    assert verify(out, capsys, "--key", keys["signer"][1]) == (0, [])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["num_samples"] == 8 and len(manifest["shards"]) == 2
    assert manifest["rejects"]["total"] == 2  # read through zstd: the two bad records are rejects with reasons
    assert manifest["rejects"]["by_reason"] == {"malformed_json": 1, "no_assistant_turn": 1}
    assert cli("pipeline.verify", str(out)).returncode == 0


def test_truncation_is_counted_in_the_manifest_and_the_summary(finished):
    out, proc = finished
    manifest = json.loads((out / "manifest.json").read_text())
    flags = [flag for p in sorted((out / "shards").glob("*.parquet")) for flag in pq.read_table(p)["truncated"]]
    truncated = sum(flag.as_py() for flag in flags)
    assert 0 < truncated < len(flags) == manifest["num_samples"]
    assert manifest["num_truncated"] == truncated
    assert f"{truncated} truncated to data.max_length" in proc.stdout


def _recompute_digest(manifest):
    manifest["provenance_digest"] = digest(manifest["provenance"])


PROVENANCE_EDITS = {
    "data_path": lambda m: m["provenance"]["config"]["data"].update(path="/data/another.jsonl"),
    "max_length": lambda m: m["provenance"]["config"]["data"].update(max_length=4096),
    "stored_digest": lambda m: m.update(provenance_digest="0" * 64),
}


@pytest.mark.parametrize("kind", sorted(PROVENANCE_EDITS))
def test_an_edited_provenance_or_digest_is_named(run, capsys, kind):
    manifest = edit_manifest(run, PROVENANCE_EDITS[kind])
    status, errors = verify(run, capsys)
    assert status == 3
    assert any(line.startswith("manifest provenance_digest ") and f"!= {digest(manifest['provenance'])!r}, the "
               "digest of its provenance" in line for line in errors), errors


@pytest.mark.parametrize("field, value", [("path", "/data/another.jsonl"), ("max_length", 4096)])
def test_an_edit_with_its_digest_recomputed_is_named_against_the_start_record(run, capsys, field, value):
    before = json.loads((run / "run.json").read_text())["config"]["data"][field]
    edit_manifest(run, lambda m: (m["provenance"]["config"]["data"].update({field: value}), _recompute_digest(m)))
    status, errors = verify(run, capsys)
    assert status == 3
    assert f"manifest provenance data.{field} {value!r} != {before!r} in run.json, the record the run started " \
           "from" in errors


REJECT_EDITS = {
    "total": (lambda m: m["rejects"].update(total=3), "manifest rejects total=3 but rejects.parquet and rejects/ "
              "hold 2 rejects"),
    "by_reason": (lambda m: m["rejects"].update(by_reason={"malformed_json": 2}), "manifest rejects "
                  "by_reason={'malformed_json': 2} but rejects.parquet and rejects/ hold {'malformed_json': 1, "
                  "'no_assistant_turn': 1}"),
}


@pytest.mark.parametrize("kind", sorted(REJECT_EDITS))
def test_edited_reject_counts_are_named(run, capsys, kind):
    edit, line = REJECT_EDITS[kind]
    edit_manifest(run, edit)
    status, errors = verify(run, capsys)
    assert status == 3 and line in errors, errors


def test_capture_rejects_under_rejects_are_counted(run, capsys):
    (run / "rejects").mkdir()
    shutil.copy(run / "rejects.parquet", run / "rejects" / "shard-00001.parquet")  # as if unit 1 had rejected two
    status, errors = verify(run, capsys)
    assert status == 3
    assert "manifest rejects total=2 but rejects.parquet and rejects/ hold 4 rejects" in errors


def test_an_edited_truncation_count_is_named(run, capsys):
    manifest = edit_manifest(run, lambda m: m.update(num_truncated=m["num_truncated"] + 1))
    status, errors = verify(run, capsys)
    assert status == 3
    assert errors[0] == (f"manifest num_truncated={manifest['num_truncated']} but its shards hold "
                         f"{manifest['num_truncated'] - 1} truncated samples")


def _move_to_other_run(run: Path) -> Path:
    """Shard 0's safetensors moved into a sibling run: the path listed next exists and has the recorded bytes (before
    #16 the run verified "sound")."""
    other = run.parent / "other-run"
    (other / "shards").mkdir(parents=True)
    shutil.move(run / ST0, other / ST0)
    return other


ATTESTED_MOVED = "attestation.intoto.json: 2 file(s) differ from what it attests: manifest.json (sha256 "


def test_a_listed_path_into_another_run_is_named(run, capsys):
    _move_to_other_run(run)
    relist(run, 0, ST0, f"../other-run/{ST0}")
    status, errors = verify(run, capsys)
    assert (status, errors[0]) == (3, f"shard-00000: listed file ../other-run/{ST0} leaves the run directory (a '..' "
                                      "component)")
    assert len(errors) == 3 and errors[1].startswith(ATTESTED_MOVED) and f"{ST0} (missing)" in errors[1], errors


def test_an_absolute_listed_path_is_named(run, capsys):
    other = _move_to_other_run(run)
    relist(run, 0, ST0, str(other / ST0))
    status, errors = verify(run, capsys)
    assert (status, errors[0]) == (3, f"shard-00000: listed file {other / ST0} is an absolute path: files are listed "
                                      "relative to the run directory")
    assert len(errors) == 3 and errors[1].startswith(ATTESTED_MOVED) and f"{ST0} (missing)" in errors[1], errors


def test_a_symlinked_shard_is_named(run, capsys):
    elsewhere = run.parent / "elsewhere.safetensors"
    shutil.move(run / ST1, elsewhere)
    os.symlink(elsewhere, run / ST1)  # the same bytes, but not the run's to vouch for
    status, errors = verify(run, capsys)
    assert status == 3
    assert errors[0] == (f"symlink {ST1} -> {elsewhere} in the run directory: a run's files are regular files in "
                         "it"), errors


def test_a_shard_only_the_pipelines_own_parser_reads_is_named(run, capsys):
    """Bytes after the last tensor of a real shard, its size and sha256 relisted: the writer's own parser reads it, the
    safetensors library (the reader of every trainer) refuses it."""
    with open(run / ST1, "ab") as f:
        f.write(bytes(8))
    record = {"sha256": sha256_file(run / ST1), "bytes": (run / ST1).stat().st_size}
    edit_manifest(run, lambda m: m["shards"][1]["files"][ST1].update(record))
    status, errors = verify(run, capsys)
    assert status == 3 and len(errors) == 3, errors  # the shard, the attestation (manifest and shard differ), the count
    assert errors[1].startswith("attestation.intoto.json: 2 file(s) differ from what it attests: manifest.json")
    assert errors[0].startswith("shard-00001: the safetensors library rejects shard-00001.safetensors (") \
        and "file not fully covered" in errors[0] and errors[0].endswith(", though the pipeline's own parser reads it")


def test_a_stray_user_file_in_the_run_root_is_named(run, capsys):
    (run / "notes.txt").write_text("my notes\n")
    status, errors = verify(run, capsys)
    assert status == 3
    assert errors[0] == "unknown file notes.txt in the run directory: not a file a run writes", errors


@pytest.mark.parametrize("name", [".manifest.json.k3j2h1x0.tmp", "shards/.shard-00001.safetensors.a8f2k1.tmp"])
def test_a_stale_temp_file_is_named(run, capsys, name):
    (run / name).write_bytes((run / "manifest.json").read_bytes()[:100])  # as a kill during the write leaves it
    status, errors = verify(run, capsys)
    assert status == 3
    assert errors[0] == f"stale temp file {name}: left by an interrupted write (a finished run has none); remove it"


def test_the_files_a_run_writes_are_known(run, capsys):
    """The out_dir lock, the gate's report and a unit's capture rejects are the run's own; a tamper-free copy stays
    sound with them present (the capture rejects are listed in the counts here, and attested, as a run that had them
    would; the lock is never attested: its lease changes while a run holds it)."""
    (run / "diff").mkdir()
    for name in ("report.json", "report.md", "report.html"):
        (run / "diff" / name).write_text("{}")
    (run / "rejects").mkdir()
    shutil.copy(run / "rejects.parquet", run / "rejects" / "shard-00000.parquet")
    edit_manifest(run, lambda m: m["rejects"].update(total=4, by_reason={"malformed_json": 2,
                                                                          "no_assistant_turn": 2}))
    status, errors = verify(run, capsys)
    assert status == 3 and errors[-2] == ("attestation.intoto.json: 4 file(s) of the run are not attested: "
                                          "diff/report.html, diff/report.json, diff/report.md ...")
    forge_records(run)
    (run / ".lock").write_text("pid 1 host x\n")
    status, errors = verify(run, capsys)
    assert (status, errors) == (0, [])


def test_the_cli_names_a_tampered_run_on_stderr(run):
    (run / "notes.txt").write_text("x")
    bad_sha = sha256_file(run / "manifest.json")
    proc = cli("pipeline.verify", str(run))
    assert proc.returncode == 3
    assert proc.stderr.splitlines() == ["unknown file notes.txt in the run directory: not a file a run writes",
                                        f"1 problem(s) in {run}"]
    assert sha256_file(run / "manifest.json") == bad_sha  # verify reads, never writes


# Issue #24: what verify recomputes (ids, token digests) and what only a key proves.

def _swap(table: pa.Table, column: str, i: int, j: int) -> pa.Table:
    values = table[column].to_pylist()
    values[i], values[j] = values[j], values[i]
    return table.set_column(table.schema.get_field_index(column), column, pa.array(values, table.schema.field(column).type))


@pytest.mark.parametrize("columns", [("sample_id",), ("sample_id", "row")])
def test_swapped_sample_ids_with_recomputed_checksums_are_named(run, capsys, columns):
    """Before #24, two rows with their ids swapped (every checksum recomputed) verified sound, and RunReader served
    each sample under the other's id. An id is sha256(data digest:row) of run.json's digest: the swapped ids are not
    their rows' (and with the rows swapped too, the rows are out of the data's order)."""
    path = run / "shards" / "shard-00000.parquet"
    table = pq.read_table(path)
    first, second = table["sample_id"].to_pylist()[:2]
    rows = table["row"].to_pylist()[:2]
    for column in columns:
        table = _swap(table, column, 0, 1)
    pq.write_table(table, path)
    forge_records(run)
    with RunReader(run) as reader:  # what the check stops: the reader serves the first sample's tokens as the second
        assert reader.tokens(second)["input_ids"].shape[0] == table["num_tokens"][0].as_py()
    status, errors = verify(run, capsys)
    assert status == 3
    if columns == ("sample_id",):
        assert errors[:-1] == [
            f"shard-00000: sample {second!r} (row {rows[0]}) is stored under another sample's id: the id of row "
            f"{rows[0]} is {first!r} (sha256 of run.json's data_digest and the row)",
            f"shard-00000: sample {first!r} (row {rows[1]}) is stored under another sample's id: the id of row "
            f"{rows[1]} is {second!r} (sha256 of run.json's data_digest and the row)"]
    else:
        assert errors[:-1] == [f"shard-00000: sample {first!r} (row {rows[0]}) comes after row {rows[1]}: a run stores "
                               "its samples in the data's order, each row once"]


def test_moved_loss_mask_tokens_are_named(run, capsys):
    """One loss-mask token of a sample moved onto one of its prompt tokens: the same loss-token count, the checksums
    recomputed. The version-3 token digest covers the mask, so the row's digest no longer matches its tensors."""
    tensors, meta = shard_tensors(run / ST0)
    offsets, mask = tensors["sample_offsets"].tolist(), tensors["loss_mask"]
    start, end = offsets[1], offsets[2]  # the shard's second sample
    trained, prompt = (mask[start:end] == 1).nonzero().flatten(), (mask[start:end] == 0).nonzero().flatten()
    mask[start + int(trained[-1])], mask[start + int(prompt[-1])] = 0, 1
    save_file(tensors, str(run / ST0), metadata=meta)
    forge_records(run)
    second = pq.read_table(run / "shards" / "shard-00000.parquet")["sample_id"][1].as_py()
    status, errors = verify(run, capsys)
    assert status == 3 and len(errors) == 2, errors
    assert errors[0].startswith(f"shard-00000: token_digest of sample {second!r} (row 1) is "), errors
    assert "safetensors says" in errors[0]


@pytest.mark.parametrize("signatures", ["none", "kept"])
def test_a_forged_run_passes_the_unsigned_verify_and_is_caught_by_the_key(run, capsys, keys, signatures):
    """Every hidden state of shard 1 tripled, then every checksum and the attestation recomputed without the key (its
    signature dropped, or the original one kept): consistent, so the unsigned verify says sound, as docs/explanation/what-verify-proves.md
    says it must; the signer's public key does not verify the forged statement."""
    tensors, meta = shard_tensors(run / ST1)
    tensors["hidden_states"] = tensors["hidden_states"] * 3
    save_file(tensors, str(run / ST1), metadata=meta)
    forge_records(run, signatures=signatures)
    assert verify(run, capsys) == (0, [])
    status, errors = verify(run, capsys, "--key", keys["signer"][1])
    assert status == 3 and len(errors) == 2, errors
    want = "attestation.intoto.json is not signed: --key " if signatures == "none" else \
        "attestation.intoto.json: no signature verifies with --key "
    assert errors[0].startswith(want), errors


def test_a_signed_run_is_proven_by_its_key_and_refused_by_another(finished, capsys, keys):
    out, _ = finished
    capsys.readouterr()
    assert verify_main([str(out), "--key", str(keys["signer"][1])]) == 0
    signer = keyid(load_public_key(keys["signer"][1]))
    assert f"attestation signed by keyid {signer[:16]}... (--key)" in capsys.readouterr().out
    status, errors = verify(out, capsys, "--key", keys["other"][1])
    other = keyid(load_public_key(keys["other"][1]))
    assert (status, errors) == (3, [
        f"attestation.intoto.json: no signature verifies with --key (keyid {other[:16]}...; signatures by keyid "
        f"{signer[:16]}...): the run was not attested by that key's holder, or was changed after it was signed",
        f"1 problem(s) in {out}"])
    proc = cli("pipeline.verify", str(out), "--key", str(keys["other"][0]))  # the private half is not a public key
    assert proc.returncode == 2 and "that is a private key: give its public half" in proc.stderr


def test_the_attestation_covers_every_file_and_the_provenance(finished, keys):
    out, _ = finished
    envelope = json.loads((out / attestation.NAME).read_text())
    statement = json.loads(base64.b64decode(envelope["payload"]))
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file() and p.name != ".lock")
    assert sorted(s["name"] for s in statement["subject"]) == sorted(set(files) - {attestation.NAME})
    assert all(s["digest"]["sha256"] == sha256_file(out / s["name"]) for s in statement["subject"])
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicate"] == json.loads((out / "manifest.json").read_text())["provenance"]
    assert [s["keyid"] for s in envelope["signatures"]] == [
        keyid(load_public_key(keys["signer"][1]))]


def test_a_sign_key_that_is_not_a_private_key_is_a_configuration_error(tmp_path, keys):
    proc = cli("pipeline.extract", f"out_dir={tmp_path / 'run'}", *RUN, f"hydra.run.dir={tmp_path / 'logs'}",
               f"sign_key={keys['other'][1]}")
    assert proc.returncode == 2 and not (tmp_path / "run").exists()
    assert f"configuration error: sign_key='{keys['other'][1]}': signing key {keys['other'][1]} is not a PEM private " \
           "key (that is a public key: give the private key that signs)" in proc.stdout + proc.stderr
