"""speculators' own training CLI, run as its users run it, on an export of ours, on CPU: the shim in
drivers/speculators_cpu.py redirects only the device. The draft vocabulary comes from the export's own files through
the flags its sidecar prints (so the trainer writes nothing into the export); the checkpoint the trainer writes is
what vLLM would be given, and the doctor finds it wired as the export says."""
from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
from safetensors import safe_open

from tests.exports.conftest import cli
from tests.helpers.runs import snapshot
from tests.helpers.trainers import speculators_train

pytestmark = pytest.mark.integration
N = 64
EPOCHS = 3


def _npy(path) -> np.ndarray:
    with open(path, "rb") as f:
        return np.lib.format.read_array(f, allow_pickle=False)  # an array of objects is refused, never unpickled


@pytest.fixture(scope="module")
def cli_trained(llama_run, models_root, tmp_path_factory):
    root = tmp_path_factory.mktemp("speculators-cli")
    export = root / "export"
    proc = cli("pipeline.export", str(llama_run), "--format", "speculators", "--out", str(export),
               "--draft-vocab", str(N))
    assert proc.returncode == 0, proc.stderr
    sidecar = json.loads((export / "export.json").read_text())
    before = snapshot(export)
    args = speculators_train(models_root / "tiny-llama", export, root / "ckpt", epochs=EPOCHS, total_seq_len=256,
                             lr=3e-3, log_dir=root / "logs")
    done = subprocess.run(args, cwd=root, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return export, sidecar, before, root / "ckpt"


def test_the_cli_trains_from_the_exports_vocabulary_and_writes_nothing_into_it(cli_trained):
    export, sidecar, before, ckpt = cli_trained
    assert snapshot(export) == before
    last = ckpt / str(EPOCHS - 1)
    config = json.loads((last / "config.json").read_text())
    assert config["architectures"] == ["Eagle3DraftModel"] and config["draft_vocab_size"] == N
    assert config["eagle_aux_hidden_state_layer_ids"] == sidecar["serving"]["vllm"]["aux_layer_ids"]
    with safe_open(str(last / "model.safetensors"), framework="np") as f:
        for role in ("d2t", "t2d"):  # the files the export lists
            assert np.array_equal(f.get_tensor(role), _npy(export / sidecar["draft_vocab"]["files"][role]["path"]))
        assert f.get_slice("fc.weight").get_shape() == [256, 3 * 256]  # three aux states, H = 256
    state = json.loads((last / "training_state.json").read_text())
    assert state["epoch"] == EPOCHS - 1 and state["global_step"] > EPOCHS
    first, final = (json.loads((ckpt / str(e) / "val_metrics.json").read_text())["loss_epoch"] for e in (0, EPOCHS - 1))
    assert final < first, (first, final)  # it learned something on held-out rows


def test_the_doctor_finds_the_cli_trained_draft_wired_as_the_export_says(cli_trained, models_root):
    export, _, _, ckpt = cli_trained
    proc = cli("pipeline.doctor", "--draft", str(ckpt / str(EPOCHS - 1)), "--serve", "vllm", "--export", str(export),
               "--target", str(models_root / "tiny-llama"), "--json")
    report = json.loads(proc.stdout)
    checks = {c["check"]: c for c in report["checks"]}
    assert proc.returncode == 0, report
    assert checks["aux-ids"]["status"] == "OK" and "captures b1,b3,b5" in checks["aux-ids"]["message"]
    assert checks["norm-before-residual"]["status"] == "OK" and checks["final-norm"]["status"] == "OK"
