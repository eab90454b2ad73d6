"""Each engine's options class (`pipeline.engines.options`): defaults, types, ranges and misspellings, each error naming
the option's config path; one class per engine, shared by the driver's check and the adapter, importable without the
engine."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from pipeline.core.contracts import EngineSpec
from pipeline.engines.hf_options import HFOptions
from pipeline.engines.options import EngineOptions, OptionsError
from pipeline.engines.registry import check_options, engine_class, engine_names, options_class
from pipeline.engines.sglang.options import SGLangOptions
from pipeline.engines.vllm.options import VLLMOptions
from tests.helpers import REPO

CLASSES = {"hf": HFOptions, "vllm": VLLMOptions, "sglang": SGLangOptions}


def refused(cls: type[EngineOptions], options: dict, where: str = "engine.options") -> str:
    with pytest.raises(OptionsError) as error:
        cls.parse(options, where)
    return str(error.value)


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_the_registry_and_the_adapter_name_one_class(name):
    assert options_class(name) is CLASSES[name] is engine_class(name).options_type


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_every_option_is_documented_and_the_defaults_parse(name):
    cls = CLASSES[name]
    assert cls.names()[0] == "python" and all(len(doc) > 10 for doc in cls.docs().values()), cls.docs()
    assert cls.parse({}) == cls()


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_the_presets_in_conf_engine_parse(name):
    preset = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "engine" / f"{name}.yaml"))
    check_options(EngineSpec(name=name, options=preset["options"]), "engine")


def test_the_options_modules_import_no_engine_and_nothing_beyond_the_standard_library():
    code = ("import json, sys; import pipeline.engines.hf_options, pipeline.engines.vllm.options, "
            "pipeline.engines.sglang.options; print(json.dumps(sorted(sys.modules)))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                                       check=True).stdout)
    third_party = {m.split(".")[0] for m in loaded} & {"torch", "numpy", "vllm", "sglang", "transformers", "omegaconf",
                                                       "hydra"}
    assert not third_party and not [m for m in loaded if m.startswith("pipeline.") and "options" not in m
                                    and m not in ("pipeline.engines", "pipeline.engines.vllm",
                                                  "pipeline.engines.sglang")]


@pytest.mark.parametrize("cls, wrong, right", [
    (HFOptions, "attn_implmentation", "attn_implementation"),
    (VLLMOptions, "disable_custom_rotery", "disable_custom_rotary"),
    (SGLangOptions, "aux_layer_id", "aux_layer_ids"),
])
def test_a_misspelled_option_names_the_closest_valid_one(cls, wrong, right):
    assert refused(cls, {wrong: 1}, "diff.reference.options") == (
        f"unknown option diff.reference.options.{wrong} (did you mean diff.reference.options.{right}?)")


def test_an_option_without_a_close_match_lists_the_valid_ones_and_every_unknown_key_is_named():
    assert refused(HFOptions, {"zzz": 1, "attn_implem": "eager"}) == (
        "unknown option engine.options.zzz (valid options: python, attn_implementation, device); unknown option "
        "engine.options.attn_implem (did you mean engine.options.attn_implementation?)")


@pytest.mark.parametrize("cls, options, message", [
    (HFOptions, {"attn_implementation": None}, "attn_implementation=None: must be a string"),
    (HFOptions, {"python": 3}, "python=3: must be a string or null"),
    (VLLMOptions, {"seed": True}, "seed=True: must be an integer"),  # YAML's true is not 1
    (VLLMOptions, {"seed": 1.5}, "seed=1.5: must be an integer"),
    (VLLMOptions, {"engine_core_process": "yes"}, "engine_core_process='yes': must be true or false or null"),
    (VLLMOptions, {"kv_cache_space_gib": 0}, "kv_cache_space_gib=0: must be >= 1"),
    (VLLMOptions, {"gpu_memory_utilization": 0}, "gpu_memory_utilization=0: must be in (0, 1]"),
    (VLLMOptions, {"max_num_batched_tokens": 0}, "max_num_batched_tokens=0: must be >= 1 or null"),
    (SGLangOptions, {"device": "tpu"}, "device='tpu': must be one of 'auto', 'cpu', 'cuda'"),
    (SGLangOptions, {"aux_layer_ids": [1, "29"]}, "aux_layer_ids=[1, '29']: must be a list of integers or null"),
    (SGLangOptions, {"max_tokens_per_forward": 0}, "max_tokens_per_forward=0: must be >= 1"),
    (SGLangOptions, {"mem_fraction_static": 1.5}, "mem_fraction_static=1.5: must be in (0, 1] or null"),
])
def test_a_wrong_type_or_value_names_the_option_and_what_it_must_be(cls, options, message):
    assert refused(cls, options) == f"engine.options.{message}"


def test_valid_options_become_typed_fields():
    vllm = VLLMOptions.parse({"gpu_memory_utilization": 1, "max_model_len": 2048, "disable_custom_rotary": True})
    assert vllm.gpu_memory_utilization == 1.0 and isinstance(vllm.gpu_memory_utilization, float)
    assert (vllm.max_model_len, vllm.disable_custom_rotary, vllm.seed) == (2048, True, 0)
    sglang = SGLangOptions.parse({"device": "cpu", "aux_layer_ids": (1, 29, 57), "mem_fraction_static": 0.5})
    assert (sglang.device, list(sglang.aux_layer_ids), sglang.max_tokens_per_forward) == ("cpu", [1, 29, 57], 16384)
    assert HFOptions.parse({"attn_implementation": "eager", "python": "/p"}).to_dict() == {
        "python": "/p", "attn_implementation": "eager", "device": "cpu"}


def test_check_options_names_the_config_path_and_the_engine():
    spec = EngineSpec(name="vllm", options={"max_model_lenn": 2048})
    with pytest.raises(OptionsError, match=r"^unknown option gate\.engines\[1\]\.options\.max_model_lenn for "
                                           r"engine=vllm \(did you mean gate\.engines\[1\]\.options\."
                                           r"max_model_len\?\)$"):
        check_options(spec, "gate.engines[1]")
    with pytest.raises(ValueError, match="engine='nosuch' is unknown"):
        check_options(EngineSpec(name="nosuch"), "engine")
    assert set(CLASSES) <= set(engine_names())
