"""Real runs to export (HF engine, tiny models, several shards each) and the trainers' own environments.

Trainer code runs only in its own virtualenv (.venv-speculators, .venv-specforge; scripts/trainers/*.sh) through the
drivers in drivers/; results come back as safetensors and JSON, never as a pickle.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors import safe_open

REPO = Path(__file__).resolve().parents[2]
DRIVERS = Path(__file__).resolve().parent / "drivers"
TRAINER_VENVS = {"speculators": REPO / ".venv-speculators", "specforge": REPO / ".venv-specforge"}


def cli(module: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=600, env=env)


def extract(out: Path, *overrides: str) -> Path:
    proc = cli("pipeline.extract", f"out_dir={out}", "gate.mode=off", f"hydra.run.dir={out.parent / 'logs'}",
               *overrides)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def trainer(name: str, mode: str, export: Path, result: Path, *args: str) -> tuple[dict, Path]:
    """Run drivers/<name>_driver.py in that trainer's environment; (result.json, loaded.safetensors path)."""
    python = TRAINER_VENVS[name] / "bin" / "python"
    if not python.exists():
        pytest.fail(f"{python} is missing: run bash scripts/trainers/{name}.sh (scripts/setup.sh runs it)")
    proc = subprocess.run([str(python), str(DRIVERS / f"{name}_driver.py"), mode, str(export), str(result), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{name} driver ({mode}) failed:\n{proc.stderr[-4000:]}"
    return json.loads((result / "result.json").read_text()), result / "loaded.safetensors"


def read_all(path: Path) -> dict:
    with safe_open(str(path), framework="pt") as f:
        return {key: f.get_tensor(key) for key in f.keys()}


@pytest.fixture(scope="session")
def llama_run(tmp_path_factory, models_root) -> Path:
    """Tiny Llama (6 layers): aux b1,b3,b5, bN = b6 and final_norm; 12 samples in 3 shards."""
    return extract(tmp_path_factory.mktemp("llama") / "run", "model=tiny_llama", "capture.points=[1,3,5,last,final_norm]",
                   "data.limit=12", "runner.max_samples_per_shard=5")


@pytest.fixture(scope="session")
def kimi_run(tmp_path_factory, models_root) -> Path:
    """Tiny Kimi INT4 (DeepSeek, 8 layers) in float32 (the Llama run is bfloat16: both dtypes kept): embedding, aux
    b1,b4,b7, bN = b8 and final_norm; 8 samples in 3 shards."""
    return extract(tmp_path_factory.mktemp("kimi") / "run", "capture.points=[embed,1,4,7,last,final_norm]",
                   "engine.dtype=float32", "data.limit=8", "runner.max_samples_per_shard=3")


@pytest.fixture(scope="session")
def resumed_run(tmp_path_factory, llama_run) -> Path:
    """The Llama run as an interrupted one leaves it (no manifest, its last shard gone), then resumed by a rerun."""
    run = tmp_path_factory.mktemp("resumed") / "run"
    shutil.copytree(llama_run, run)
    (run / "manifest.json").unlink()
    for path in (run / "shards").glob("shard-00002.*"):
        path.unlink()
    proc = cli("pipeline.extract", f"out_dir={run}", "gate.mode=off", f"hydra.run.dir={run.parent / 'logs'}",
               "model=tiny_llama", "capture.points=[1,3,5,last,final_norm]", "data.limit=12",
               "runner.max_samples_per_shard=5")
    assert proc.returncode == 0 and "(2 finished earlier)" in proc.stdout, proc.stdout + proc.stderr[-2000:]
    return run


@pytest.fixture(scope="session")
def fp8_run(tmp_path_factory, models_root) -> Path:
    """Tiny Llama captured in bfloat16 and stored in float8_e4m3fn (the exports dequantize it); 6 samples in 2
    shards."""
    return extract(tmp_path_factory.mktemp("fp8") / "run", "model=tiny_llama", "capture.points=[1,3,5,last,final_norm]",
                   "data.limit=6", "runner.max_samples_per_shard=4", "runner.storage_dtype=float8_e4m3fn")


@pytest.fixture(scope="session")
def runs(llama_run, kimi_run, resumed_run, fp8_run) -> dict[str, Path]:
    return {"llama": llama_run, "kimi": kimi_run, "resumed": resumed_run, "fp8": fp8_run}


@pytest.fixture(scope="session")
def trained(tmp_path_factory, llama_run, models_root):
    """trained(fmt) -> (export dir, result.json, draft dir): the Llama run exported in `fmt` and one optimisation step
    of that trainer's own EAGLE-3 draft on 3 of its samples, the draft saved by the trainer's own save_pretrained.
    Each format is trained once per session (the training test and the doctor's end-to-end test share it)."""
    done: dict[str, tuple[Path, dict, Path]] = {}

    def _trained(fmt: str) -> tuple[Path, dict, Path]:
        if fmt not in done:
            root = tmp_path_factory.mktemp(f"trained-{fmt}")
            proc = cli("pipeline.export", str(llama_run), "--format", fmt, "--out", str(root / "export"))
            assert proc.returncode == 0, proc.stderr
            result, _ = trainer(fmt, "train", root / "export", root / "result", str(models_root / "tiny-llama"), "3")
            done[fmt] = (root / "export", result, root / "result" / "draft")
        return done[fmt]

    return _trained
