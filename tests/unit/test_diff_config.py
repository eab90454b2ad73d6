"""The diff's configuration: conf/diff/default.yaml, engine entries, presets, validation naming field and value."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pipeline.compare.anchors import moe_layers
from pipeline.compare.lineup import other_entries, probe_run, reference_entry
from pipeline.config import ConfigError, DiffConfig, DiffJobConfig, to_config
from pipeline.config.entries import SpecError, parse_entry, to_spec, unique
from pipeline.models.info import ModelInfo
from tests.helpers.diff import diff_composed


def test_the_diff_job_reads_its_own_config():
    """conf/diff.yaml: the diff group as extract composes it, the model's points as `diff.points=capture`'s."""
    cfg = to_config(diff_composed("out_dir=x", "storage_dtype=float8_e4m3fn"), DiffJobConfig)
    assert dataclasses.asdict(cfg.diff) == dataclasses.asdict(DiffConfig())
    assert (cfg.capture.points, cfg.capture.convention) == (cfg.model.points, "canonical") and cfg.model.points
    assert cfg.storage_dtype == "float8_e4m3fn"
    with pytest.raises(ConfigError, match=r"^storage_dtype='int8': must be null or one of"):
        to_config(diff_composed("out_dir=x", "storage_dtype=int8"), DiffJobConfig)


def test_the_yaml_is_the_schema_default(compose_cfg):
    cfg = to_config(compose_cfg())
    assert dataclasses.asdict(cfg.diff) == dataclasses.asdict(DiffConfig())
    assert (cfg.diff.reference, cfg.diff.engines, cfg.gate.mode) == ("hf@float32", ["hf@bfloat16"], "stop")


def test_engine_entries_as_strings_and_mappings(compose_cfg):
    cfg = to_config(compose_cfg("diff.engines=[sglang,vllm@bfloat16,{name:hf,dtype:float32,label:hf-w,"
                                "options:{python:/x/bin/python}}]", "diff.reference=hf"))
    ref = reference_entry(cfg.diff.reference)
    specs = other_entries(cfg.diff.engines, "diff.engines", ref)
    assert [s.display for s in specs] == ["sglang", "vllm@bfloat16", "hf-w"]
    assert specs[2].options == {"python": "/x/bin/python"} and specs[2].dtype == "float32"


def test_an_entry_equal_to_the_reference_is_the_reference():
    ref = parse_entry("hf@float32", "r")
    assert other_entries(["hf@float32", "hf@bfloat16"], "diff.engines", ref) == [parse_entry("hf@bfloat16", "e")]
    with pytest.raises(ConfigError, match="both called 'hf@float32'; give one a label"):
        other_entries([{"name": "hf", "dtype": "float32", "options": {"python": "/p"}}], "diff.engines", ref)
    assert len(unique([parse_entry("hf", "a"), parse_entry("hf", "b")])) == 1


@pytest.mark.parametrize("override, match", [
    ("gate.mode=maybe", r"gate\.mode='maybe'"),
    ("gate.html=sometimes", r"gate\.html='sometimes': must be one of \('on_failure', 'always', 'never'\)"),
    ("diff.engines=[hf@fp64]", r"diff\.engines\[0\]='hf@fp64': dtype 'fp64' must be one of"),
    ("diff.engines=[{dtype:float32}]", r"an engine entry needs a name"),
    ("diff.engines=[{name:hf,colour:red}]", r"unknown key\(s\) \['colour'\]"),
    ("diff.reference=''", r"diff\.reference=''"),
    ("diff.alignment.ambiguous=ignore", r"diff\.alignment\.ambiguous='ignore'"),
    ("diff.probe.alone=9", r"diff\.probe\.alone=9"),
    ("gate.probe.repeats=0", r"gate\.probe\.repeats=0"),
    ("diff.points=some", r"diff\.points='some'"),
    ("diff.thresholds.bfloat16.top1=1.5", r"diff\.thresholds\.bfloat16\.top1=1\.5"),
])
def test_field_checks_name_field_and_value(compose_cfg, override, match):
    with pytest.raises(ValueError, match=match):
        to_config(compose_cfg(override))


def test_thresholds_are_keyed_by_compute_dtype():
    from pipeline.config import Thresholds

    with pytest.raises(ValueError, match=r"diff\.thresholds='int8': keys are compute dtypes"):
        DiffConfig(thresholds={"int8": Thresholds(rel_l2=1, cosine=0, top1=0, kl=1)})


def test_an_entry_starts_from_its_engine_preset():
    hf = to_spec(parse_entry("hf@bfloat16", "e"))
    assert (hf.name, hf.dtype, hf.batch_size, hf.options) == ("hf", "bfloat16", 8, {"attn_implementation": "sdpa", "device": "cpu"})
    custom = to_spec(parse_entry({"name": "hf", "batch_size": 2, "options": {"attn_implementation": "eager"}}, "e"))
    assert (custom.dtype, custom.batch_size, custom.options) == ("auto", 2, {"attn_implementation": "eager", "device": "cpu"})
    unknown = to_spec(parse_entry("someday@float32", "e"))  # no preset: EngineSpec defaults
    assert (unknown.name, unknown.dtype, unknown.options) == ("someday", "float32", {})


def _model(tmp_path: Path) -> ModelInfo:
    return ModelInfo(path=tmp_path, model_type="llama", architecture="LlamaForCausalLM", family="llama",
                     num_layers=4, hidden_size=64, torch_dtype="bfloat16", quantization=None)


def test_unknown_engines_fail_before_anything_starts(tmp_path):
    with pytest.raises(ConfigError, match=r"diff\.engines\[0\]: engine='tensorrt' is unknown; known engines: "):
        probe_run(parse_entry("tensorrt", "e"), role="engine", model=_model(tmp_path), points=[], where="diff.engines[0]")
    with pytest.raises(ConfigError, match="model_path='/nowhere'"):
        probe_run(parse_entry({"name": "hf", "model_path": "/nowhere"}, "e"), role="engine", model=_model(tmp_path),
              points=[], where="diff.engines[0]")
    with pytest.raises(SpecError):
        parse_entry(3, "diff.engines[0]")


def test_moe_layers_from_the_model_config():
    kimi = {"text_config": {"num_hidden_layers": 61, "n_routed_experts": 384, "first_k_dense_replace": 1,
                            "moe_layer_freq": 1}}
    assert moe_layers(kimi) == set(range(2, 62))  # layer k sits between b(k-1) and b(k); layer 1 is dense
    assert moe_layers({"num_hidden_layers": 4, "num_local_experts": 8}) == {1, 2, 3, 4}
    assert moe_layers({"num_hidden_layers": 4, "num_experts": 8, "mlp_only_layers": [0]}) == {2, 3, 4}
    assert moe_layers({"num_hidden_layers": 4}) == set()
