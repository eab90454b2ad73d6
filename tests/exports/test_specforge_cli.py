"""SpecForge's own training CLI, run as its users run it, on an export of ours, on CPU: `specforge train --config
run.json [overrides]` through the shim in drivers/specforge_cpu.py, which redirects only the device. The run is
offline (the export's feature files, no target model served) and its config is validated by SpecForge's own schema;
the checkpoint it writes is materialised by SpecForge's own `specforge export --to sglang`, which is what SGLang would
be given, and the doctor finds it wired as the export's sidecar says."""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from safetensors import safe_open

from tests.exports.conftest import DRIVERS, TRAINER_VENVS, cli
from tests.helpers.runs import snapshot

pytestmark = pytest.mark.integration
RUN_ID = "cpu"
EPOCHS = 2
STEP_LOG = re.compile(r"^step (\d+): (\{.*\})$", re.MULTILINE)  # SpecForge's console logger (training/assembly.py)
# The short-run knobs, as command-line overrides of the config (SpecForge re-validates them through its schema); the
# fixture adds training.batch_size = the export's sample count, so that every step trains on all of them and the two
# epochs' losses are over the same data. On 2 cores a step costs ~13 s, nearly all of it bf16 matmuls over the
# 4096-token vocabulary (emulated on CPUs without AVX-512 BF16: ~40x float32) and the Triton interpreter running the
# loss kernel, both growing with batch_size * max_length, the draft's share also with ttt_length; max_length 32 trains
# on each sample's first 32 tokens.
OVERRIDES = (f"training.num_epochs={EPOCHS}", "data.max_length=32", "training.ttt_length=2")


def _indexed_target(model: Path, out: Path) -> Path:
    """The target as a sharded checkpoint is laid out: SpecForge's TargetHead.load_weights
    (modeling/target/target_head.py) finds lm_head.weight only through a *.index.json and refuses a one-file
    checkpoint. Links to the model's own files, beside an index naming the one file that holds every weight."""
    out.mkdir()
    for path in model.iterdir():
        (out / path.name).symlink_to(path.resolve())
    with safe_open(str(model / "model.safetensors"), framework="np") as f:
        weight_map = {key: "model.safetensors" for key in f.keys()}
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return out


def _draft_config(target: Path, sidecar: dict, out: Path) -> Path:
    """One EAGLE-3 layer shaped like the target, its aux ids the sidecar's SGLang ids (what serving it will capture).
    The draft vocabulary is the target's: the tiny Llama's random head spreads its argmax over ~700 tokens, so a
    frequency-chosen draft vocabulary would mask nearly every position out of the loss."""
    config = json.loads((target / "config.json").read_text())
    out.write_text(json.dumps({
        **config, "architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1,
        "draft_vocab_size": config["vocab_size"], "tie_word_embeddings": False,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": sidecar["serving"]["sglang"]["aux_layer_ids"]}}))
    return out


def _run_config(root: Path, target: Path, draft: Path, export: Path) -> Path:
    """An offline run as a user writes it (data.hidden_states_path: SpecForge walks the export for its *.ckpt files),
    one process, SpecForge's defaults elsewhere (FSDP SHARD_GRAD_OP, bfloat16, cosine schedule) but a short run's
    learning rate, sdpa attention (the default flex_attention is a compiled kernel) and no loader processes."""
    path = root / "run.json"  # SpecForge's loader reads YAML or JSON by the file's suffix
    path.write_text(json.dumps({
        "model": {"target_model_path": str(target), "draft_model_config": str(draft)},
        "data": {"hidden_states_path": str(export), "cache_dir": str(root / "cache"), "dataloader_num_workers": 0},
        "training": {"strategy": "eagle3", "attention_backend": "sdpa", "learning_rate": 3e-3, "log_interval": 1},
        "output_dir": str(root / "ckpt"), "run_id": RUN_ID}, indent=2))
    return path


def _specforge(root: Path, *cmd: str) -> subprocess.CompletedProcess:
    """A command of SpecForge's environment, run in `root` (SpecForge resolves no path of ours against it)."""
    # TORCH_COMPILE_DISABLE: SpecForge torch.compiles its rotary, RMSNorm, teacher and metric helpers; on a CPU
    # inductor builds C++ for them (~40 s of the first step on 2 cores) and the losses agree to 1e-5 either way.
    # HF_HUB_OFFLINE: an offline run of local files must not need the hub.
    env = {**os.environ, "TORCH_COMPILE_DISABLE": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-4000:]
    return done


@pytest.fixture(scope="module")
def cli_trained(llama_run, models_root, tmp_path_factory):
    root = tmp_path_factory.mktemp("specforge-cli")
    export = root / "export"
    proc = cli("pipeline.export", str(llama_run), "--format", "specforge", "--out", str(export))
    assert proc.returncode == 0, proc.stderr
    sidecar = json.loads((export / "export.json").read_text())
    before = snapshot(export)
    target = _indexed_target(models_root / "tiny-llama", root / "target")
    draft_config = _draft_config(target, sidecar, root / "draft.json")
    config = _run_config(root, target, draft_config, export)
    venv = TRAINER_VENVS["specforge"] / "bin"
    done = _specforge(root, str(venv / "python"), str(DRIVERS / "specforge_cpu.py"), "train", "--config", str(config),
                      *OVERRIDES, f"training.batch_size={sidecar['num_samples']}")
    steps = {int(n): ast.literal_eval(metrics) for n, metrics in STEP_LOG.findall(done.stdout)}
    # the runtime checkpoint (training_state.pt) as a model directory, by SpecForge's own exporter (no device)
    _specforge(root, str(venv / "specforge"), "export", "--to", "sglang", "--checkpoint", str(root / "ckpt"),
               "--draft-config", str(draft_config), "--output-dir", str(root / "draft"))
    return export, sidecar, before, steps, root


def test_the_cli_trains_on_the_export_and_writes_nothing_into_it(cli_trained):
    export, sidecar, before, steps, root = cli_trained
    assert snapshot(export) == before
    # nothing beside its output_dir either (data.cache_dir stays unused: the draft vocabulary is the target's)
    assert sorted(p.name for p in root.iterdir()) == ["ckpt", "draft", "draft.json", "export", "run.json", "target"]
    assert sorted(steps) == list(range(1, EPOCHS + 1))  # one optimiser step per epoch
    for metrics in steps.values():  # the logger's window: samples / seconds * seconds / steps = samples per step
        samples = metrics["perf/global_samples_per_second"] * metrics["perf/optimizer_step_time_s"]
        assert round(samples) == sidecar["num_samples"]  # every file of the export, each epoch
    assert steps[EPOCHS]["loss"] < steps[1]["loss"], steps  # the same samples, after one step on them
    ckpt = root / "ckpt" / f"{RUN_ID}-step{EPOCHS}"
    assert (ckpt / "training_state.pt").is_file()  # SpecForge's runtime checkpoint (a pickle: read only there)
    assert (root / "ckpt" / f"{RUN_ID}-latest").resolve() == ckpt.resolve()


def test_specforge_exports_the_checkpoint_with_the_sidecars_serving_ids(cli_trained):
    _, sidecar, _, _, root = cli_trained
    config = json.loads((root / "draft" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["num_hidden_layers"] == 1
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == sidecar["serving"]["sglang"]["aux_layer_ids"]
    with safe_open(str(root / "draft" / "model.safetensors"), framework="pt") as f:
        assert f.get_slice("fc.weight").get_shape() == [256, 3 * 256]  # three aux states, H = 256
        assert not [key for key in f.keys() if "embed" in key]  # SGLang takes the embedding from the target
        assert not f.get_tensor("d2t").any() and f.get_tensor("t2d").all()  # draft vocabulary = the target's


def test_the_doctor_finds_the_cli_trained_draft_wired_as_the_export_says(cli_trained, models_root):
    export, _, _, _, root = cli_trained
    proc = cli("pipeline.doctor", "--draft", str(root / "draft"), "--serve", "sglang", "--export", str(export),
               "--target", str(models_root / "tiny-llama"), "--json")
    report = json.loads(proc.stdout)
    checks = {c["check"]: c for c in report["checks"]}
    assert proc.returncode == 0, report
    assert report["draft"]["format"] == "specforge" and report["draft"]["architecture"] == "LlamaForCausalLMEagle3"
    assert checks["aux-ids"]["status"] == "OK" and "captures b1,b3,b5" in checks["aux-ids"]["message"]
    assert checks["weights"]["status"] == "OK" and "LlamaForCausalLMEagle3" in checks["weights"]["message"]
    assert checks["final-norm"]["status"] == "OK" and checks["fc-width"]["status"] == "OK"
