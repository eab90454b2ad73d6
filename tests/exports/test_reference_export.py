"""One copy on disk (`pipeline.export --states reference`): the export holds no state, speculators' own training CLI
reads every state from the run through the project's backend (pipeline/trainers/, in .venv-speculators), and trains
exactly the draft a full copy trains; a run moved, replaced or edited since the export, or a sample that fails a check
on arrival, is refused naming the sample and the file, never skipped."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from tests.exports.conftest import cli, extract
from tests.helpers.seaweed import SECRET, upload_run
from tests.helpers.trainers import SPECULATORS_PYTHON, speculators_train

from pipeline.core.stores import open_store
from pipeline.exports.run_states import RunStates, RunStatesError
from pipeline.shards import validate as validate_module
from pipeline.shards.reader import RunReader
from pipeline.trainers.speculators import BACKEND, prepared_argv

pytestmark = pytest.mark.integration
N = 64  # draft vocabulary
LOSS = re.compile(r"train/loss_(\d)=([0-9.]+)")


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _export(run: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return cli("pipeline.export", str(run), "--format", "speculators", "--out", str(out), "--draft-vocab", str(N),
               *extra)


@pytest.fixture(scope="module")
def exports(llama_run, tmp_path_factory):
    root = tmp_path_factory.mktemp("reference")
    for name, extra in (("full", ()), ("ref", ("--states", "reference"))):
        proc = _export(llama_run, root / name, *extra)
        assert proc.returncode == 0, proc.stderr
    return root


def _train(models_root: Path, export: Path, save: Path, *extra: str, workers: int = 0) -> subprocess.CompletedProcess:
    args = speculators_train(models_root / "tiny-llama", export, save, epochs=2, total_seq_len=256, lr=3e-3,
                             num_workers=workers, extra=extra)
    return subprocess.run(args, cwd=save.parent, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def trained(exports, models_root):
    out = {}
    for name in ("full", "ref"):  # the reference read in a data loader worker (spawned: the backend is pickled)
        done = _train(models_root, exports / name, exports / f"ckpt-{name}", workers=1 if name == "ref" else 0)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        out[name] = (exports / f"ckpt-{name}", [(int(i), v) for i, v in LOSS.findall(done.stdout)])
    return out


def test_the_reference_export_holds_no_state(exports, llama_run):
    ref, full = exports / "ref", exports / "full"
    sidecar = json.loads((ref / "export.json").read_text())
    assert sidecar["states"] == "reference" and sidecar["files"]["first_sample"] is None
    assert not (ref / "hidden_states").exists() and (full / "hidden_states" / "hs_0.safetensors").is_file()
    assert set(sidecar["run_files"]) == {rel for s in json.loads((llama_run / "manifest.json").read_text())["shards"]
                                         for rel in s["files"]}
    run, ref_bytes, full_bytes = _du(llama_run), _du(ref), _du(full)
    print(f"run {run} B, reference export {ref_bytes} B ({ref_bytes / run:.2%}), full export {full_bytes} B")
    # the token columns and vocabulary files only: 12 samples of a 256-wide model; it shrinks with the width
    assert ref_bytes < 0.02 * run < full_bytes
    rerun = _export(llama_run, ref, "--states", "reference")
    assert rerun.returncode == 0 and "already complete" in rerun.stdout
    other = _export(llama_run, ref)  # the same OUT for a full copy: another export's plan
    assert other.returncode == 2 and len(other.stderr.strip().splitlines()) == 1, other.stderr


def test_specforge_takes_no_reference(llama_run, tmp_path):
    proc = cli("pipeline.export", str(llama_run), "--format", "specforge", "--out", str(tmp_path / "x"), "--states",
               "reference")
    assert proc.returncode == 2 and "speculators' trainer only" in proc.stderr and not (tmp_path / "x").exists()


def test_speculators_cli_trains_the_same_draft_from_the_run(trained):
    (full, full_losses), (ref, ref_losses) = trained["full"], trained["ref"]
    assert len(full_losses) >= 6 and ref_losses == full_losses  # every logged step's loss, every TTT step
    assert "--hidden-states-backend pipeline-run" in (ref / "1" / "train_command.txt").read_text()
    for epoch in ("0", "1"):
        assert (full / epoch / "model.safetensors").read_bytes() == (ref / epoch / "model.safetensors").read_bytes()


def test_the_trainer_reads_a_run_in_a_bucket_and_trains_the_same_draft(trained, llama_run, s3_url, models_root,
                                                                       tmp_path, monkeypatch):
    """A training node with nothing of the run or the export on its disk: the reference export written to the bucket
    and copied from there by the wrapper (its few small files), the states read from the bucket by ranges in a data
    loader worker (the backend pickled into it, its own S3 client there), give every loss and every weight of the
    run on disk."""
    upload_run(llama_run, s3_url)
    export = f"{s3_url}-ref"
    proc = _export(s3_url, export, "--states", "reference", "--spool-dir", str(tmp_path / "spool"))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(open_store(export).get("export.json"))["run_dir"] == s3_url
    monkeypatch.setenv("PIPELINE_SPOOL_DIR", str(tmp_path / "spool"))  # where the wrapper copies the export to
    done = _train(models_root, export, tmp_path / "ckpt", workers=1)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert SECRET not in done.stdout + done.stderr
    ref, ref_losses = trained["ref"]
    assert [(int(i), v) for i, v in LOSS.findall(done.stdout)] == ref_losses
    for epoch in ("0", "1"):
        assert (tmp_path / "ckpt" / epoch / "model.safetensors").read_bytes() == \
            (ref / epoch / "model.safetensors").read_bytes()


def test_the_doctor_reads_a_reference_export(trained, exports, models_root, tmp_path):
    ckpt = trained["ref"][0] / "1"
    shifted = tmp_path / "shifted"
    shutil.copytree(ckpt, shifted)
    config = json.loads((shifted / "config.json").read_text())
    config["eagle_aux_hidden_state_layer_ids"] = [i + 1 for i in config["eagle_aux_hidden_state_layer_ids"]]
    (shifted / "config.json").write_text(json.dumps(config))
    verdicts = {}
    for name, draft in (("wired", ckpt), ("shifted", shifted)):
        proc = cli("pipeline.doctor", "--draft", str(draft), "--serve", "vllm", "--export", str(exports / "ref"),
                   "--target", str(models_root / "tiny-llama"), "--json")
        verdicts[name] = (proc.returncode, {c["check"]: c["status"] for c in json.loads(proc.stdout)["checks"]})
    assert verdicts["wired"][0] == 0 and verdicts["wired"][1]["aux-ids"] == "OK", verdicts
    assert verdicts["shifted"][0] != 0 and verdicts["shifted"][1]["aux-ids"] == "MISMATCH", verdicts


# -- refusals ---------------------------------------------------------------------------------------------------------


@pytest.fixture()
def own_run(llama_run, tmp_path):
    """A copy of the run (mtimes kept) and its reference export, to edit."""
    run = tmp_path / "run"
    shutil.copytree(llama_run, run)
    proc = _export(run, tmp_path / "ref", "--states", "reference")
    assert proc.returncode == 0, proc.stderr
    return run, tmp_path / "ref"


def _tensor_file(run: Path, index: int = 0) -> Path:
    files = json.loads((run / "manifest.json").read_text())["shards"][index]["files"]
    return run / next(rel for rel in files if rel.endswith(".safetensors"))


def _overwrite_keeping_mtime(path: Path, tensor: str, element: int, data: bytes) -> None:
    """Bytes of one element of `tensor` replaced in place, size and mtime kept: bit rot the stat check cannot see."""
    with safe_open(str(path), framework="pt") as f:
        names = list(f.keys())
    assert tensor in names
    with open(path, "rb") as fh:
        header_len = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(header_len))
    start = 8 + header_len + header[tensor]["data_offsets"][0] + element * len(data)
    st = os.stat(path)
    with open(path, "r+b") as fh:
        fh.seek(start)
        fh.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_run_changed_since_the_export_is_refused_at_the_start(own_run, tmp_path):
    run, ref = own_run
    RunStates(ref).check()  # as exported
    shard = _tensor_file(run, 1)
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))  # same size, new mtime
    with pytest.raises(RunStatesError, match=rf"{re.escape(str(shard))} was modified after"):
        RunStates(ref).check()
    shard.write_bytes(bytes(data) + b"\0")
    with pytest.raises(RunStatesError, match=rf"{re.escape(str(shard))} is {len(data) + 1} bytes, {len(data)} when "):
        RunStates(ref).check()
    shard.unlink()
    with pytest.raises(RunStatesError, match=rf"{re.escape(str(shard))} is missing"):
        RunStates(ref).check()
    manifest = run / "manifest.json"
    manifest.write_text(manifest.read_text() + " ")
    with pytest.raises(RunStatesError, match="is not the manifest .* was exported from"):
        RunStates(ref).check()
    run.rename(tmp_path / "moved")
    with pytest.raises(RunStatesError, match=f"its run {re.escape(str(run))} is gone"):
        RunStates(ref).check()


def test_the_trainer_stops_in_one_line_on_a_changed_run(own_run, models_root, tmp_path):
    run, ref = own_run
    (run / "manifest.json").write_text((run / "manifest.json").read_text() + " ")
    done = _train(models_root, ref, tmp_path / "ckpt")
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1].startswith("pipeline.trainers.speculators: ")
    assert "is not the manifest" in done.stderr and not (tmp_path / "ckpt").exists()


@pytest.mark.parametrize("block_bytes", [None, 1], ids=["one block", "a block per token"])
def test_a_non_finite_state_is_raised_naming_the_sample_and_the_shard(own_run, block_bytes, monkeypatch):
    run, ref = own_run
    shard = _tensor_file(run, 0)
    with RunReader(run) as reader:
        tokens = len(reader.tokens(reader.sample_ids[0])["input_ids"])
        width = len(reader.points) * reader.manifest["hidden_size"]
    token = 0
    if block_bytes is not None:  # the sample checked a token at a time: its last token's block too
        monkeypatch.setattr(validate_module, "FINITE_BLOCK_BYTES", block_bytes)
        token = tokens - 1
    _overwrite_keeping_mtime(shard, "hidden_states", token * width, b"\xc0\x7f")  # bf16 NaN in sample 0, point b1
    states = RunStates(ref)
    states.check()  # size and mtime kept: only the arrival check can see it
    with pytest.raises(RunStatesError, match=rf"sample 0 \(.*\) in {re.escape(str(shard))}: 1 non-finite value\(s\), "
                                             rf"first at token {token}, slot 0 \(b1\)"):
        states.sample(0)
    assert states.sample(1)["hidden_states"].isfinite().all()  # the others still read


def test_token_ids_that_differ_from_the_dataset_are_raised(own_run):
    run, ref = own_run
    shard = _tensor_file(run, 0)
    with safe_open(str(shard), framework="pt") as f:
        ids = f.get_slice("input_ids")[0:1]
    _overwrite_keeping_mtime(shard, "input_ids", 0, (int(ids[0]) + 1).to_bytes(ids.element_size(), "little"))
    with pytest.raises(RunStatesError, match=r"sample 0 .*token ids differ from the export's dataset row 0 \(first "
                                             r"at token 0\)"):
        RunStates(ref).sample(0)


def test_a_key_proves_the_run_or_refuses_it(own_run, tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    run, ref = own_run
    pub = tmp_path / "pub.pem"
    pub.write_bytes(Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    with pytest.raises(RunStatesError, match="is not proven by"):  # the run is unsigned: no key proves it
        RunStates(ref).check(key=pub)


def test_the_wrapper_chooses_the_backend_for_a_reference_export_only(exports):
    ref, full = str(exports / "ref"), str(exports / "full")
    assert prepared_argv(["--data-path", ref]) == ["--data-path", ref, "--hidden-states-backend", BACKEND]
    assert prepared_argv([f"--data-path={full}"]) == [f"--data-path={full}"]
    with pytest.raises(SystemExit, match="is a reference export"):
        prepared_argv(["--data-path", ref, "--hidden-states-backend", "file"])
    with pytest.raises(RunStatesError, match="not a reference export"):
        RunStates(full).check()


def test_the_backend_registers_in_speculators_environment():
    code = ("import pipeline.trainers.speculators_backend; from hs_connectors import HiddenStatesBackend; "
            "import speculators.train.config.resolution as r; print(sorted(HiddenStatesBackend.registry))")
    done = subprocess.run([str(SPECULATORS_PYTHON), "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and BACKEND in done.stdout, done.stderr[-2000:]
    assert sys.executable != str(SPECULATORS_PYTHON)


@pytest.fixture(scope="module")
def run_without_last(tmp_path_factory, models_root):
    """final_norm but no bN, as SGLang gives it: speculators' last slot is then derived (--last final_norm)."""
    return extract(tmp_path_factory.mktemp("nolast") / "run", "model=tiny_llama", "capture.points=[1,3,5,final_norm]",
                   "data.limit=4", "runner.max_samples_per_shard=3")


@pytest.mark.parametrize("case", ["bf16", "fp8", "last-final-norm"])
def test_every_sample_equals_the_full_copys_file(case, llama_run, fp8_run, run_without_last, tmp_path):
    """What the backend hands the trainer is bit for bit what a full export writes: bf16 as stored, fp8 storage
    dequantized the same way, and `--last final_norm`'s derived last slot (checked on arrival as on export)."""
    from safetensors.torch import load_file

    run = {"bf16": llama_run, "fp8": fp8_run, "last-final-norm": run_without_last}[case]
    extra = ("--last", "final_norm") if case == "last-final-norm" else ()
    for name, states in (("full", ()), ("ref", ("--states", "reference"))):
        proc = _export(run, tmp_path / name, *extra, *states)
        assert proc.returncode == 0, proc.stderr
    states = RunStates(tmp_path / "ref")
    num = json.loads((tmp_path / "ref" / "export.json").read_text())["num_samples"]
    assert len(states) == num and num >= 4
    for i in range(num):
        want, got = load_file(tmp_path / "full" / "hidden_states" / f"hs_{i}.safetensors"), states.sample(i)
        assert got["hidden_states"].dtype == want["hidden_states"].dtype == torch.bfloat16
        assert torch.equal(got["hidden_states"].view(torch.int16), want["hidden_states"].view(torch.int16)), i
        assert torch.equal(got["token_ids"], want["token_ids"])


def test_a_draft_trains_from_an_fp8_run_within_its_rounding(fp8_run, models_root, tmp_path):
    """#37: an fp8 run (float8_e4m3fn, one scale per token and point) read through the backend, dequantized on read,
    trains the draft; the same draft on the same samples captured in bf16 is the reference. The inputs differ by the
    run's own recorded rounding (relative L2 per point, manifest `storage.rounding_rel_l2`), and a loss is smooth in
    its inputs, so at every logged step the fp8 run's loss stays within that relative distance of the bf16 run's; a
    scale or layout bug moves it far more (as the fp8 export's bound, tests/exports/test_fp8_export.py)."""
    bf16 = extract(tmp_path / "bf16" / "run", "model=tiny_llama", "capture.points=[1,3,5,last,final_norm]",
                   "data.limit=6", "runner.max_samples_per_shard=4")
    losses = {}
    for name, run in (("bf16", bf16), ("fp8", fp8_run)):
        proc = _export(run, tmp_path / f"ref-{name}", "--states", "reference")
        assert proc.returncode == 0, proc.stderr[-2000:]
        done = _train(models_root, tmp_path / f"ref-{name}", tmp_path / f"ckpt-{name}")
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        losses[name] = [float(v) for _, v in LOSS.findall(done.stdout)]
    storage = json.loads((fp8_run / "manifest.json").read_text())["storage"]
    assert storage["dtype"] == "float8_e4m3fn"
    rounding = max(storage["rounding_rel_l2"].values())
    assert len(losses["fp8"]) == len(losses["bf16"]) >= 4 and losses["fp8"] != losses["bf16"]
    worst = max(abs(a - b) / b for a, b in zip(losses["fp8"], losses["bf16"]))
    print(f"\nfp8 run rounding (rel L2, worst point) {rounding:.4f}; worst relative loss difference over "
          f"{len(losses['bf16'])} logged steps {worst:.4f}")
    assert 0 < worst <= rounding


def _run_with_its_own_model(run_without_last: Path, where: Path) -> tuple[Path, Path, str]:
    """A copy of the run whose manifest names a copy of its model: (run, the model's weights file, its final norm's
    tensor name). Its manifest is edited, so exports of it are made without verification."""
    run, model = where / "run", where / "model"
    shutil.copytree(run_without_last, run)
    manifest = json.loads((run / "manifest.json").read_text())
    shutil.copytree(manifest["provenance"]["model"]["path"], model)
    manifest["provenance"]["model"]["path"] = str(model)
    (run / "manifest.json").write_text(json.dumps(manifest))
    weights = next(model.glob("*.safetensors"))
    with safe_open(str(weights), "pt") as f:
        name = next(k for k in f.keys() if k.endswith("norm.weight") and "layers." not in k)
    return run, weights, name


def _scale_weight(weights: Path, name: str, factor: float) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(weights)
    tensors[name] = tensors[name] * factor
    save_file(tensors, str(weights))


def _export_reference(run: Path, out: Path) -> None:
    from pipeline.exports.driver import export_run
    from pipeline.exports.formats import exporter_for

    export_run(run, out, exporter_for("speculators"), last="final_norm", verify=False, states="reference")


def test_a_reference_export_refuses_another_checkpoints_final_norm_when_it_is_made(run_without_last, tmp_path):
    """Its last slot is derived on every read: one sample is derived when the export is made, so a run whose
    final_norm is not its checkpoint's norm is refused there, in one line, not at the trainer's first batch."""
    from pipeline.exports.slots import ExportError

    run, weights, name = _run_with_its_own_model(run_without_last, tmp_path)
    _scale_weight(weights, name, 2.0)  # the same model but for its final norm's weight
    with pytest.raises(ExportError, match=r"sample \S+: the trainer's norm of final_norm / w is .* is not "
                                          rf"{re.escape(str(weights.parent))}: {re.escape(name)} applied"):
        _export_reference(run, tmp_path / "ref")
    assert not (tmp_path / "ref" / "export.json").exists()  # left unfinished (a rerun with these settings refuses)
    _export_reference(run_without_last, tmp_path / "own")  # its own checkpoint: made, one round trip recorded
    last_state = json.loads((tmp_path / "own" / "export.json").read_text())["last_state"]
    assert last_state["round_trip"]["samples_checked"] == 1 and last_state["round_trip"]["worst_rel_l2"] < 8e-3


def test_a_checkpoint_changed_after_the_export_is_refused_at_the_start(run_without_last, tmp_path):
    """The derived slot divides by the final-norm weight the export recorded (its sha256): another weight at the
    run's model path is refused when the trainer starts, before any batch."""
    run, weights, name = _run_with_its_own_model(run_without_last, tmp_path)
    _export_reference(run, tmp_path / "ref")
    assert RunStates(tmp_path / "ref").check()["last_state"]["derived"]
    _scale_weight(weights, name, 1.5)
    with pytest.raises(RunStatesError, match=rf"^{re.escape(str(weights.parent))}: {re.escape(name)} is not the "
                                             "final-norm weight .* was exported with"):
        RunStates(tmp_path / "ref").check()
