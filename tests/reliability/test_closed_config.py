"""The schema is closed: a key it does not declare is a configuration error (exit status 2) naming the key and the
closest valid one, also when `+` or `++` adds it or a plain override names it (before Hydra composes); free-form
nodes (engine.options, diff entries) stay open in the schema (each engine's options class checks its options when the
run is resolved: test_misspelled_engine_options.py)."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config import ConfigError, DiffJobConfig, ExtractConfig, config_groups, to_config
from pipeline.config.closed import unknown_override_keys
from tests.helpers.cli import cli
from tests.helpers.diff import composed, diff_composed

pytestmark = pytest.mark.reliability
REPO = Path(__file__).resolve().parents[2]
GROUPS = config_groups()
DIFF_KEYS = ", ".join(f.name for f in dataclasses.fields(DiffJobConfig))


def test_a_misspelled_plus_key_stops_extract_before_anything_is_written(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "pipeline.extract", f"out_dir={out}", "+runner.max_samples_per_shrad=8",
                           f"hydra.run.dir={tmp_path / 'logs'}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-3000:]
    errors = [line for line in output.splitlines() if "[ERROR]" in line]
    assert len(errors) == 1 and "Traceback" not in output, output[-3000:]
    assert errors[0].endswith("configuration error: unknown config key runner.max_samples_per_shrad (did you mean "
                              "runner.max_samples_per_shard?)")
    assert not out.exists()


@pytest.mark.parametrize("override, message", [
    ("++runner.max_samples_per_shrad=8", "runner.max_samples_per_shrad (did you mean runner.max_samples_per_shard?)"),
    ("+data.max_lenght=64", "data.max_lenght (did you mean data.max_length?)"),
    ("+gate.probe.num_sample=2", "gate.probe.num_sample (did you mean gate.probe.num_samples?)"),
    ("+diff.thresholds.bfloat16.rel_l3=0.1", "diff.thresholds.bfloat16.rel_l3 (did you mean "
                                             "diff.thresholds.bfloat16.rel_l2?)"),
    ("+engine.batchsize=4", "engine.batchsize (did you mean engine.batch_size?)"),
    ("+overwrite_all=true", "overwrite_all (did you mean overwrite?)"),
    ("+zzz=1", f"zzz (valid keys: {', '.join(f.name for f in dataclasses.fields(ExtractConfig))})"),
])
def test_every_unknown_key_is_named_with_the_closest_valid_one(compose_cfg, override, message):
    with pytest.raises(ConfigError) as error:
        to_config(compose_cfg(override, "out_dir=x"))
    assert str(error.value) == f"unknown config key {message}"
    plain = override.lstrip("+")  # the same key without `+`: Hydra would refuse it while composing, exit status 1
    assert unknown_override_keys(ExtractConfig, ["out_dir=x", plain], GROUPS) == f"unknown config key {message}"


@pytest.mark.parametrize("module, override, message", [
    ("pipeline.extract", "runner.max_samples_per_shrad=8",
     "runner.max_samples_per_shrad (did you mean runner.max_samples_per_shard?)"),
    ("pipeline.diff", "daat.limit=3", "daat (did you mean data?)"),
])
def test_a_misspelled_plain_override_is_a_configuration_error_too(tmp_path, module, override, message):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", module, f"out_dir={out}", override], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() == f"configuration error: unknown config key {message}"
    assert not out.exists()


@pytest.mark.parametrize("override", [
    "model=tiny_llama", "engine=vllm", "exp=kimi", "+exp=kimi", "engine.options.my_flag=1", "diff.engines=[hf]",
    "diff.thresholds.bfloat16.rel_l2=0.1", "diff.thresholds.float64.rel_l2=0.1", "hydra.run.dir=x", "--cfg",
    "capture.points=[1,final_norm]", "~diff.reference", "not an override",
])
def test_group_choices_free_form_keys_and_hydras_own_are_left_to_hydra(override):
    assert unknown_override_keys(ExtractConfig, [override], GROUPS) is None


def test_two_unknown_keys_are_named_in_one_line(compose_cfg):
    with pytest.raises(ConfigError, match=r"^unknown config keys data\.limt \(did you mean data\.limit\?\); "
                                          r"runner\.overlap \(did you mean runner\.overlap_writes\?\)$"):
        to_config(compose_cfg("+data.limt=3", "+runner.overlap=true", "out_dir=x"))


def test_free_form_nodes_stay_open(compose_cfg):
    cfg = to_config(compose_cfg("+engine.options.my_flag=1", "out_dir=x",
                                "diff.engines=[{name:hf,dtype:float32,label:x,options:{anything:1}}]",
                                "diff.reference={name:hf,dtype:float32}"))
    assert cfg.engine.options["my_flag"] == 1
    assert cfg.diff.engines[0]["options"] == {"anything": 1}


@pytest.mark.parametrize("override", ["runner.num_replicas=2", "overwrite=true", "engine.dtype=float32",
                                      "+runner.num_replicas=2", "+overwrite=true"])
def test_the_diff_refuses_a_key_only_extract_reads(tmp_path, override):
    """The diff's schema is its own (conf/diff.yaml): extract's runner, engine and overwrite are not ignored there."""
    out = tmp_path / "diff"
    proc = cli("pipeline.diff", f"out_dir={out}", override, f"hydra.run.dir={tmp_path / 'logs'}", timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-3000:]
    key = override.lstrip("+").split(".")[0].split("=")[0]
    assert f"configuration error: unknown config key {key} (valid keys: {DIFF_KEYS})" in output, output[-3000:]
    assert "probing" not in output and "Traceback" not in output  # refused before any engine starts
    assert not out.exists()


def test_the_diff_config_composes_into_its_own_schema_only():
    """A job given another job's composed config is refused rather than read for keys it was never checked for."""
    assert isinstance(to_config(diff_composed("out_dir=x"), DiffJobConfig), DiffJobConfig)
    with pytest.raises(ConfigError, match="schema is ExtractConfig, not DiffJobConfig"):
        to_config(composed("out_dir=x"), DiffJobConfig)
