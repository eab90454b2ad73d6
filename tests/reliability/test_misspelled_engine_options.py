"""A misspelled engine option, on any engine and wherever engine options are given (the primary's `engine.options`,
`diff.reference.options`, a `diff.engines` or `gate.engines` entry's), is a configuration error (exit status 2)
naming the option's config path and the closest valid spelling, before any engine starts.

"No engine started" is observed, not inferred from timing: every refused engine is given an interpreter
(`options.python`) that is a wrapper script recording each start in a marker file before it runs the engine's real
Python, so a worker process the pipeline spawned for it would leave a line there. The run also writes nothing: no
output directory, and no write step in the fault trace (`PIPELINE_FAULT_TRACE`)."""
from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config import ConfigError, to_config
from pipeline.run.resolve import resolve_run
from tests.helpers import REPO
from tests.helpers.cli import cli
from tests.helpers.drafts import make_draft

pytestmark = pytest.mark.reliability
# engine -> (the interpreter its worker runs, a misspelled option, its value, the valid spelling)
ENGINES = {
    "hf": (sys.executable, "attn_implementatoin", "eager", "attn_implementation"),
    "vllm": (str(REPO / ".venv-vllm" / "bin" / "python"), "max_model_lenn", 2048, "max_model_len"),
    "sglang": (str(REPO / ".venv-sglang" / "bin" / "python"), "max_tokens_per_forwrd", 4096, "max_tokens_per_forward"),
}


def spawn_recorder(tmp_path: Path, engine: str) -> tuple[Path, Path]:
    """(an interpreter that appends a line to the marker file, then runs the engine's own Python; the marker)."""
    marker, wrapper = tmp_path / f"{engine}-started.txt", tmp_path / f"{engine}-python.sh"
    wrapper.write_text(f'#!/bin/sh\necho "$$ $*" >> "{marker}"\nexec "{ENGINES[engine][0]}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return wrapper, marker


def entry(engine: str, wrapper: Path) -> str:
    """A diff entry for `engine` with the misspelled option, run by the recording interpreter."""
    _, wrong, value, _ = ENGINES[engine]
    return f"{{name:{engine},dtype:float32,label:checked,options:{{python:'{wrapper}',{wrong}:{value}}}}}"


def overrides(command: str, role: str, engine: str, wrapper: Path) -> list[str]:
    _, wrong, value, _ = ENGINES[engine]
    if role == "primary" and command == "pipeline.extract":
        return [f"engine={engine}", f"+engine.options.python='{wrapper}'", f"+engine.options.{wrong}={value}"]
    if role == "primary":  # pipeline.diff: the engines compared with the reference
        return [f"diff.engines=[{entry(engine, wrapper)}]"]
    return [f"diff.reference={entry(engine, wrapper)}"]


def where(command: str, role: str) -> str:
    if role == "reference":
        return "diff.reference"
    return "engine" if command == "pipeline.extract" else "diff.engines[0]"


def test_the_recording_interpreter_records_a_start(tmp_path):
    """The proof below is only as good as the marker: a start through the wrapper does leave its line."""
    wrapper, marker = spawn_recorder(tmp_path, "hf")
    subprocess.run([str(wrapper), "-c", "pass"], check=True, timeout=60)
    assert marker.read_text().strip().endswith("-c pass")


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("role", ["primary", "reference"])
@pytest.mark.parametrize("command", ["pipeline.extract", "pipeline.diff"])
def test_a_misspelled_option_is_refused_before_any_engine_starts(tmp_path, command, role, engine):
    wrapper, marker = spawn_recorder(tmp_path, engine)
    out, trace = tmp_path / "out", tmp_path / "trace.txt"
    proc = cli(command, f"out_dir={out}", f"hydra.run.dir={tmp_path / 'logs'}",
               *overrides(command, role, engine, wrapper), env={"PIPELINE_FAULT_TRACE": str(trace)}, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-3000:]
    errors = [line for line in output.splitlines() if "[ERROR]" in line]
    _, wrong, _, right = ENGINES[engine]
    at = f"{where(command, role)}.options"
    assert len(errors) == 1 and "Traceback" not in output, output[-3000:]
    assert errors[0].endswith(f"configuration error: unknown option {at}.{wrong} for engine={engine} "
                              f"(did you mean {at}.{right}?)"), errors[0]
    assert not marker.exists(), f"an engine worker was started: {marker.read_text()}"
    assert "probing" not in output  # the diff and the gate log each engine they start
    steps = trace.read_text().split() if trace.exists() else []
    assert not out.exists() and steps == [command.replace("pipeline.", "start:")]  # the command began; wrote nothing


@pytest.mark.parametrize("override, message", [
    ("+engine.options.max_model_len=abc", "engine.options.max_model_len='abc': must be an integer or null"),
    ("+engine.options.gpu_memory_utilization=2", "engine.options.gpu_memory_utilization=2: must be in (0, 1]"),
    ("+engine.options.disable_custom_rotary=1", "engine.options.disable_custom_rotary=1: must be true or false"),
    ("+engine.options.num_gpu_blocks=8", "unknown option engine.options.num_gpu_blocks for engine=vllm (valid "
                                         "options: python, kv_cache_space_gib, gpu_memory_utilization, max_model_len, "
                                         "max_num_batched_tokens, attention_backend, disable_custom_rotary, "
                                         "engine_core_process, seed)"),
])
def test_a_wrongly_typed_or_unknown_primary_option_names_it(compose_cfg, override, message):
    with pytest.raises(ConfigError) as error:
        resolve_run(to_config(compose_cfg("engine=vllm", override, "out_dir=x")))
    assert str(error.value) == message


def test_the_gates_engines_are_checked_also_with_the_gate_off(compose_cfg):
    """A misspelled option is not left for the day the gate is turned on."""
    cfg = compose_cfg("gate.mode=off", "gate.engines=[{name:sglang,options:{device:cpu,log_levl:info}}]",
                      "out_dir=x")
    with pytest.raises(ConfigError, match=r"^unknown option gate\.engines\[0\]\.options\.log_levl for "
                                          r"engine=sglang \(did you mean gate\.engines\[0\]\.options\.log_level"
                                          r"\?\)$"):
        resolve_run(to_config(cfg))


def test_the_measuring_engines_misspelled_option_is_refused_before_vllm_starts(tmp_path, models_root):
    """pipeline.accept's vLLM (engine vllm-speculate, through the registry) takes typed options too: a misspelled
    `--engine-option` is one line naming it and the closest spelling, exit 2, no worker started, nothing written."""
    wrapper, marker = spawn_recorder(tmp_path, "vllm")
    config = (models_root / "tiny-llama" / "config.json").read_text()
    draft = make_draft(tmp_path / "draft", json.loads(config), schema="speculators", aux_ids=[0, 2, 4])
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"messages": [{"role": "user", "content": "Name three colours."}]}\n')
    proc = cli("pipeline.accept", "--draft", str(draft), "--serve", "vllm", "--target", str(models_root / "tiny-llama"),
               "--prompts", str(prompts), "--out", str(tmp_path / "out"), "--engine-option", f"python={wrapper}",
               "--engine-option", "gpu_memory_utilisation=0.9", timeout=300)
    assert proc.returncode == 2, (proc.stdout + proc.stderr)[-3000:]
    assert proc.stderr.strip().splitlines() == [
        "error: unknown option --engine-option gpu_memory_utilisation for engine=vllm-speculate (did you mean "
        "--engine-option gpu_memory_utilization?)"], proc.stderr[-3000:]
    assert not marker.exists(), f"an engine worker was started: {marker.read_text()}"
    assert not (tmp_path / "out").exists()
