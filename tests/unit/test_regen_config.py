"""The regeneration job's config: conf/regenerate.yaml and the Kimi recipe compose into RegenerateConfig, sampling
comes from sampling.*, then the model's published values, then greedy, and each bad value names its setting."""
from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from pipeline.config import ConfigError, RegenerateConfig, register_configs, to_config
from tests.conftest import CONF


def regen_cfg(*overrides: str) -> RegenerateConfig:
    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return to_config(compose(config_name="regenerate", overrides=list(overrides)), RegenerateConfig)
    finally:
        GlobalHydra.instance().clear()


def test_the_default_is_greedy_on_the_embedded_default(models_root):
    cfg = regen_cfg()
    assert cfg.engine.name == "hf" and cfg.model.name == "tiny-k25-int4-8l"
    values, origin = cfg.sampling.resolved(cfg.model.sampling)
    assert values == {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": 512}
    assert set(origin.values()) == {"default"}


def test_the_kimi_recipe_regenerates_with_sglang_at_tp8_and_moonshots_sampling(models_root):
    cfg = regen_cfg("+exp=kimi", "model.path=/models/Kimi-K2.5", "data.path=/data/p.jsonl")
    assert (cfg.engine.name, cfg.engine.tp_size, cfg.engine.dtype) == ("sglang", 8, "bfloat16")
    values, origin = cfg.sampling.resolved(cfg.model.sampling)
    assert values == {"temperature": 1.0, "top_p": 0.95, "top_k": 0, "max_tokens": 7168}
    assert origin["temperature"] == "model.sampling.temperature" and origin["top_k"] == "default"
    instant, origin = regen_cfg("+exp=kimi", "model.path=/m", "data.path=/d", "sampling.temperature=0.6") \
        .sampling.resolved({"temperature": 1.0, "top_p": 0.95})
    assert instant["temperature"] == 0.6 and origin["temperature"] == "sampling.temperature"


@pytest.mark.parametrize("overrides, message", [
    (("sampling.n=2",), "sampling.n=2: n > 1 needs a temperature > 0"),
    (("sampling.top_p=0",), "sampling.top_p=0"),
    (("sampling.temperature=-1",), "sampling.temperature=-1"),
    (("+model.sampling.temprature=1",), "model.sampling"),
])
def test_bad_sampling_names_its_setting(models_root, overrides, message):
    cfg = regen_cfg(*overrides)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("+", r"\+")):
        cfg.sampling.resolved(cfg.model.sampling)


def test_an_extract_only_key_is_a_configuration_error(models_root):
    register_configs()
    with pytest.raises(ConfigError, match="capture"):
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            to_config(compose(config_name="regenerate", overrides=["+capture.points=[1]"]), RegenerateConfig)
    GlobalHydra.instance().clear()
