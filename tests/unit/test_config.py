"""The real conf/ tree composes, validates, and rejects bad values naming the field and the value."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.config import to_config
from pipeline.run.resolve import ConfigError, resolve_run

REPO = Path(__file__).resolve().parents[2]

KIMI_K25_CONFIG = {  # the shape of Kimi-K2.5's config.json: a multimodal wrapper around a DeepSeek-V3 text model
    "architectures": ["KimiK25ForConditionalGeneration"],
    "model_type": "kimi_k25",
    "text_config": {
        "model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 61,
        "hidden_size": 7168, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "n_routed_experts": 384,
        "first_k_dense_replace": 1, "moe_layer_freq": 1, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
    },
    "quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized"},
}


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "conv.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                             {"role": "assistant", "content": "hello"}]}) + "\n")
    return path


@pytest.fixture
def kimi_dir(tmp_path):
    d = tmp_path / "Kimi-K2.5"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(KIMI_K25_CONFIG))
    return d


def test_default_composes_to_the_embedded_tiny_run(compose_cfg):
    cfg = to_config(compose_cfg())
    assert (cfg.model.build, cfg.engine.name, cfg.runner.name) == ("tiny-k25-int4-8l", "hf", "local")
    assert cfg.data.path.endswith("pipeline/data/bundled/conversations.jsonl")
    assert cfg.capture.points == ["embed", 1, 4, 7, "final_norm"]


def test_kimi_recipe_requires_the_checkpoint_path(compose_cfg):
    with pytest.raises(ValueError, match=r"model\.path=None: a model checkpoint directory is required"):
        to_config(compose_cfg("+exp=kimi", "data.path=/data/x.jsonl"))


def test_kimi_recipe_composes_and_validates(compose_cfg, kimi_dir, data_file, tmp_path):
    cfg = to_config(compose_cfg("+exp=kimi", f"model.path={kimi_dir}", f"data.path={data_file}",
                                f"out_dir={tmp_path / 'run'}"))
    assert (cfg.engine.name, cfg.engine.tp_size, cfg.engine.dtype) == ("sglang", 8, "bfloat16")
    # the model's gate (conf/model_gate/kimi_k25.yaml, extract's alone): vLLM at TP 8 as the reference, a larger probe
    assert cfg.diff.reference == {"name": "vllm", "dtype": "bfloat16", "tp_size": 8}
    assert (cfg.gate.probe.num_samples, cfg.gate.probe.max_tokens) == (8, 512)
    run = resolve_run(cfg)
    assert [p.label for p in run.points] == ["b0", "b3", "b31", "b59", "final_norm"]
    assert (run.model.num_layers, run.model.hidden_size, run.model.family) == (61, 7168, "deepseek")


def test_every_experiment_composes(compose_cfg, kimi_dir):
    for exp in ("tiny", "kimi"):
        to_config(compose_cfg(f"+exp={exp}", f"model.path={kimi_dir}", "data.path=x.jsonl"))


@pytest.mark.parametrize("override, match", [
    ("engine.dtype=fp64", r"engine\.dtype='fp64'"),
    ("engine.batch_size=0", r"engine\.batch_size=0"),
    ("data.length_policy=drop", r"data\.length_policy='drop'"),
    ("capture.convention=tensorrt", r"capture\.convention='tensorrt'"),
    ("runner.storage_dtype=int8", r"runner\.storage_dtype='int8'"),
])
def test_field_checks_name_field_and_value(compose_cfg, override, match):
    with pytest.raises(ValueError, match=match):
        to_config(compose_cfg(override))


@pytest.mark.parametrize("overrides, match", [
    (["engine.name=tensorrt"], r"engine='tensorrt' is unknown; known engines: hf, sglang, vllm"),
    (["capture.points=[0,3,62]"], r"capture\.points=.*62.*out of range: this model has 61 decoder layers"),
    (["capture.points=[3,61]", "capture.convention=sglang"], r"sglang id 61 is out of range.*valid ids 0\.\.60"),
    (["model.path=/nonexistent/model"], r"model\.path='/nonexistent/model': no such directory"),
    (["data.path=/nonexistent/data.jsonl"], r"data\.path='/nonexistent/data\.jsonl'"),
    (["out_dir=/proc/1/run"], r"out_dir='/proc/1/run' is not writable"),
    (["out_dir={data_file}/run"], r"out_dir=.*cannot be created: .*conv\.jsonl is a file"),
])
def test_world_checks_fail_before_any_model_loads(compose_cfg, kimi_dir, data_file, tmp_path, overrides, match):
    base = [f"model.path={kimi_dir}", f"data.path={data_file}", f"out_dir={tmp_path / 'run'}"]
    overrides = [o.format(data_file=data_file) for o in overrides]
    cfg = to_config(compose_cfg("+exp=kimi", *base, *overrides))
    with pytest.raises(ConfigError, match=match):
        resolve_run(cfg)  # the Kimi "checkpoint" has no weights: any attempt to load a model would fail differently


def test_resume_record_ignores_scheduling_but_not_what_shapes_the_shards():
    from pipeline.provenance import stable_config

    config = {"out_dir": "/x", "runner": {"name": "ray", "num_replicas": 4, "max_retries": 2, "address": "auto",
                                          "max_tokens_per_shard": 4096, "storage_dtype": None},
              "engine": {"name": "hf", "batch_size": 8}}
    stable = stable_config(config)
    assert stable == {"runner": {"max_tokens_per_shard": 4096, "storage_dtype": None},
                      "engine": {"name": "hf", "batch_size": 8}}
    assert config["runner"]["name"] == "ray"  # the caller's config is left as it was


# --- whose settings a model gets (pipeline/config/model_group.py) -------------------------------------------------

@pytest.mark.parametrize("overrides, expected", [
    (["model.path=/my/ckpt"], "local"),  # a user's checkpoint, no group chosen
    (["model.path=/my/ckpt", "model.build=null"], "local"),
    (["model.path=/my/ckpt", "hydra.run.dir=x"], "local"),
    ([], "tiny_k25_int4_8l"),  # the embedded default keeps its recipe, points and trust
    (["model.path=/data/tiny-k25-int4-8l"], "tiny_k25_int4_8l"),  # the recipe, another root
    (["model=kimi_k25", "model.path=/models/Kimi-K2.5"], "kimi_k25"),
    (["+exp=kimi", "model.path=/models/Kimi-K2.5"], "kimi_k25"),
    (["model=local", "model.path=/my/ckpt"], "local"),
    (["model=tiny_llama", "model.path=/my/ckpt"], ConfigError),  # another checkpoint under a tiny model's settings
])
def test_model_path_without_a_model_group_is_model_local(models_root, overrides, expected):
    """The runner composes the command once (and once more with model=local for a user's own checkpoint)."""
    from hydra import initialize_config_dir

    from pipeline.config import CONF_DIR, register_configs
    from pipeline.config.command import composed
    from pipeline.extract import JOB as EXTRACT
    from pipeline.diff import JOB as DIFF

    register_configs()
    for job in (EXTRACT,) if "+exp=kimi" in overrides else (EXTRACT, DIFF):  # the recipe sets extract's engine
        with initialize_config_dir(config_dir=str(CONF_DIR), job_name=job.name, version_base="1.3"):
            if expected is ConfigError:
                with pytest.raises(ConfigError, match=r"model=tiny_llama is the tiny model"):
                    composed(job, overrides)
                continue
            cfg = composed(job, overrides)
            assert cfg.hydra.runtime.choices.model == expected
            assert cfg.hydra.job.name == job.name


def test_model_local_inherits_nothing_and_the_tiny_groups_keep_their_settings(compose_cfg):
    local = to_config(compose_cfg("model=local", "model.path=/my/ckpt")).model
    assert (local.name, local.build, local.points, local.trust_remote_code) == ("local", None, [], False)
    default = to_config(compose_cfg()).model
    assert (default.build, default.trust_remote_code) == ("tiny-k25-int4-8l", True)
    with pytest.raises(ValueError, match=r"model\.path=None: a model checkpoint directory is required"):
        to_config(compose_cfg("model=local"))


def test_a_tiny_group_for_another_path_is_refused_saying_what_to_write():
    from pipeline.config.model_group import ModelChoice, decide

    chosen = ModelChoice(choice="tiny_llama", default="tiny_k25_int4_8l", build="tiny-llama", path="/my/ckpt")
    with pytest.raises(ConfigError) as e:
        decide(["model=tiny_llama", "model.path=/my/ckpt"], chosen)
    assert str(e.value) == (
        "model.path='/my/ckpt' is not named after its recipe 'tiny-llama': model=tiny_llama is the tiny model "
        "'tiny-llama', which the job builds into a directory named after its recipe, with that model's capture points "
        "and settings. For your own checkpoint write model=local model.path=/my/ckpt model.points=[...] (nothing is "
        "inherited: model.trust_remote_code stays off unless you set it); to build 'tiny-llama' there, give "
        "model.path=<a directory>/tiny-llama")
    assert decide(["model=tiny_llama", "model.path=/data/tiny-llama"],
                  ModelChoice(choice="tiny_llama", default="tiny_k25_int4_8l", build="tiny-llama",
                              path="/data/tiny-llama")) == "keep"


def test_hydras_own_flags_after_the_overrides_print_the_recipes_config():
    """`python -m pipeline.extract +exp=kimi model.path=... --cfg job` prints the composed config (the job's name
    used to be appended after Hydra's flags, which its parser refused)."""
    proc = subprocess.run([sys.executable, "-m", "pipeline.extract", "+exp=kimi", "model.path=/models/Kimi-K2.5",
                           "--cfg", "job"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    printed = yaml.safe_load(proc.stdout)
    assert printed["model"]["path"] == "/models/Kimi-K2.5" and printed["diff"]["reference"]["tp_size"] == 8
