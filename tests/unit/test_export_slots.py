"""Slot plans of the trainer layouts: which captured point fills which slot, and every refusal (no run needed)."""
from __future__ import annotations

import pytest

from pipeline.exports.slots import ExportError, aux_labels, plan_slots, serving_ids
from pipeline.exports.specforge import LAYOUT as SPECFORGE
from pipeline.exports.speculators import LAYOUT as SPECULATORS

KIMI = ["b0", "b1", "b4", "b7", "b8", "final_norm"]  # 8 layers


def test_defaults_are_the_runs_aux_boundaries_and_the_layouts_last_state():
    spec = plan_slots(SPECULATORS, run_points=KIMI, num_layers=8)
    assert [p.label for p in spec.points] == ["b1", "b4", "b7", "b8"] and spec.indices == (1, 2, 3, 4)
    forge = plan_slots(SPECFORGE, run_points=KIMI, num_layers=8)
    assert [p.label for p in forge.points] == ["b1", "b4", "b7", "final_norm"] and forge.last_index == 5


def test_speculators_takes_any_number_of_aux_states_in_canonical_order():
    plan = plan_slots(SPECULATORS, run_points=KIMI, num_layers=8, aux=["b7", "embed"])
    assert [p.label for p in plan.aux] == ["b0", "b7"] and plan.aux_index == (0, 3)


@pytest.mark.parametrize("layout, points, needle", [
    (SPECULATORS, ["b1", "b4", "b7", "final_norm"], "run has no b8"),
    (SPECFORGE, ["b1", "b4", "b7", "b8"], "run has no final_norm"),
])
def test_a_missing_last_state_is_refused_never_substituted(layout, points, needle):
    with pytest.raises(ExportError, match=needle) as err:
        plan_slots(layout, run_points=points, num_layers=8)
    assert "not derived" in str(err.value)


def test_speculators_takes_final_norm_divided_by_the_norm_weight_only_when_asked_and_bn_is_missing():
    sglang = ["b1", "b4", "b7", "final_norm"]  # what SGLang can capture: no bN
    with pytest.raises(ExportError, match="--last final_norm writes final_norm divided by the final-norm weight"):
        plan_slots(SPECULATORS, run_points=sglang, num_layers=8)
    plan = plan_slots(SPECULATORS, run_points=sglang, num_layers=8, last="final_norm")
    assert [p.label for p in plan.points] == ["b1", "b4", "b7", "final_norm"] and plan.last_unnormed
    assert plan.last_index == 3 and not plan_slots(SPECULATORS, run_points=KIMI, num_layers=8).last_unnormed
    with pytest.raises(ExportError, match="must be b8"):  # a run with bN: bN is copied as it is, never derived
        plan_slots(SPECULATORS, run_points=KIMI, num_layers=8, last="final_norm")
    with pytest.raises(ExportError, match="must be final_norm"):  # no derivation the other way
        plan_slots(SPECFORGE, run_points=["b1", "b4", "b7", "b8"], num_layers=8, last="b8")
    ids = serving_ids(plan, model_type="deepseek_v3", num_layers=8)
    assert "divided by the final-norm weight" in ids["vllm"]["note"] and ids["vllm"]["aux_layer_ids"] == [1, 4, 7]


@pytest.mark.parametrize("layout, kwargs, needle", [
    (SPECFORGE, {"aux": ["b1", "b4"]}, "exactly 3 aux states, got 2"),
    (SPECFORGE, {"aux": ["b1", "b4", "b7", "b0"]}, "exactly 3 aux states, got 4"),
    (SPECULATORS, {"aux": ["b1", "b8"]}, "cannot also be an aux state"),
    (SPECULATORS, {"aux": ["final_norm"]}, "final_norm cannot be an aux state"),
    (SPECULATORS, {"aux": ["b2"]}, "b2 not captured"),
    (SPECULATORS, {"aux": ["b1", "b1"]}, "requested twice"),
    (SPECULATORS, {"aux": ["b9"]}, "out of range"),
    (SPECULATORS, {"last": "final_norm"}, "must be b8"),
    (SPECFORGE, {"last": "b8"}, "must be final_norm"),
])
def test_refusals_name_what_is_wrong(layout, kwargs, needle):
    with pytest.raises(ExportError, match=needle):
        plan_slots(layout, run_points=KIMI, num_layers=8, **kwargs)


def test_a_run_with_no_aux_boundary_is_refused():
    with pytest.raises(ExportError, match="at least one aux state"):
        plan_slots(SPECULATORS, run_points=["b0", "b8"], num_layers=8)


def test_serving_ids_per_engine():
    llama = plan_slots(SPECFORGE, run_points=["b1", "b3", "b5", "b6", "final_norm"], num_layers=6)
    ids = serving_ids(llama, model_type="llama", num_layers=6)
    assert ids["sglang"]["aux_layer_ids"] == [0, 2, 4] and ids["vllm"]["aux_layer_ids"] == [1, 3, 5]
    kimi = plan_slots(SPECULATORS, run_points=KIMI, num_layers=8)
    ids = serving_ids(kimi, model_type="deepseek_v3", num_layers=8)
    assert ids["sglang"]["aux_layer_ids"] is None and "+1" in ids["sglang"]["aux_error"]
    assert ids["sglang"]["last"] is None and ids["vllm"]["last"] == 8
    assert "cannot select these" in ids["sglang"]["note"]


def test_the_sglang_note_says_what_it_feeds_and_what_it_cannot_capture():
    # bN is the speculators trainer's target, not a served input: SGLang cannot capture it, but serves the aux states
    plan = plan_slots(SPECULATORS, run_points=["b1", "b3", "b5", "b6"], num_layers=6)
    note = serving_ids(plan, model_type="llama", num_layers=6)["sglang"]["note"]
    assert "SGLang feeds a draft only its aux states (aux_layer_ids [0, 2, 4])" in note, note
    assert "cannot capture bN" in note and "the trainer's target, never fed to a draft" in note
    assert "with vLLM" not in note, note


def test_serving_ids_of_a_model_without_a_known_numbering_say_why():
    plan = plan_slots(SPECULATORS, run_points=KIMI, num_layers=8)
    ids = serving_ids(plan, model_type="mamba", num_layers=8)
    assert ids["vllm"]["aux_layer_ids"] is None and "mamba" in ids["vllm"]["error"]


def _manifest(model_type: str = "kimi_k25", num_layers: int = 8) -> dict:
    return {"provenance": {"model": {"model_type": model_type, "num_layers": num_layers}}}


def test_aux_in_a_frameworks_native_ids_is_translated_by_the_runs_model():
    assert aux_labels([0, 3, 6], convention="specforge", manifest=_manifest()) == ["b1", "b4", "b7"]
    assert aux_labels([1, 4, 7], convention="vllm", manifest=_manifest()) == ["b1", "b4", "b7"]
    plan = plan_slots(SPECFORGE, run_points=KIMI, num_layers=8,
                      aux=aux_labels([0, 3, 6], convention="specforge", manifest=_manifest()))
    assert [p.label for p in plan.aux] == ["b1", "b4", "b7"]


def test_canonical_aux_is_left_to_the_slot_plan_as_written():
    assert aux_labels(["b1", 4, "last"], convention="canonical", manifest={}) == ["b1", "4", "last"]


@pytest.mark.parametrize("values, convention, said", [
    ([1, 4, 7], "sglang", "sglang id 7 is out of range for a 8-layer model"),  # a DeepSeek list from 1 moves by +1
    (["b1", 4], "specforge", "specforge id 'b1' is not an integer"),
    ([0, 3, 99], "specforge", "specforge id 99 is out of range"),
])
def test_a_native_id_that_names_no_point_is_named(values, convention, said):
    with pytest.raises(ExportError, match=said) as caught:
        aux_labels(values, convention=convention, manifest=_manifest())
    assert str(caught.value).startswith(f"--aux {','.join(map(str, values))} (--convention {convention}): ")


def test_native_aux_needs_the_runs_layer_count():
    with pytest.raises(ExportError, match="no model.num_layers"):
        aux_labels([0, 3, 6], convention="specforge", manifest={"provenance": {}})
