"""The doctor end to end on drafts the trainers made: the project's own export of a real run, one optimisation step of
each trainer's own EAGLE-3 draft in its own environment, the draft saved by the trainer's own save_pretrained, then
checked against the export and each server (SGLang's own loader proves the SpecForge draft's weight names)."""
from __future__ import annotations

import json

import pytest

from tests.exports.conftest import cli

pytestmark = pytest.mark.integration


def _doctor(draft, serve, export, models_root, *extra):
    proc = cli("pipeline.doctor", "--draft", str(draft), "--serve", serve, "--export", str(export), "--target",
               str(models_root / "tiny-llama"), "--json", *extra)
    assert proc.returncode in (0, 3), proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    return proc.returncode, {f["check"]: f for f in report["checks"]}, report


def test_a_specforge_trained_draft_served_by_sglang_and_by_vllm(trained, models_root):
    export, _, draft = trained("specforge")
    rc, checks, report = _doctor(draft, "sglang", export, models_root)
    assert report["draft"]["format"] == "specforge" and report["draft"]["architecture"] == "LlamaForCausalLMEagle3"
    assert rc == 0, report
    assert checks["aux-ids"]["status"] == "OK" and "captures b1,b3,b5" in checks["aux-ids"]["message"]
    assert checks["weights"]["status"] == "OK" and "LlamaForCausalLMEagle3" in checks["weights"]["message"]
    assert checks["final-norm"]["status"] == "OK" and checks["fc-width"]["status"] == "OK"
    # the same draft on vLLM: its ids are SGLang's, vLLM reads them as boundaries b0,b2,b4
    rc, checks, _ = _doctor(draft, "vllm", export, models_root)
    assert rc == 3 and checks["aux-ids"]["status"] == "MISMATCH"
    assert "will feed b0,b2,b4" in checks["aux-ids"]["message"]
    assert "set eagle_config.eagle_aux_hidden_state_layer_ids to [1, 3, 5]" in checks["aux-ids"]["message"]
    # SpecForge saves d2t even when its draft vocabulary is the target's; vLLM 0.32 then has no d2t parameter and
    # refuses the checkpoint (SGLang reads it as identity offsets)
    assert checks["weights"]["status"] == "MISMATCH" and "'draft_id_to_target_id'" in checks["weights"]["message"]


def test_a_speculators_trained_draft_served_by_vllm_and_by_sglang(trained, models_root):
    export, _, draft = trained("speculators")
    rc, checks, report = _doctor(draft, "vllm", export, models_root)
    assert report["draft"]["format"] == "speculators", report
    assert rc == 0, report
    assert checks["aux-ids"]["status"] == "OK" and "captures b1,b3,b5" in checks["aux-ids"]["message"]
    assert checks["final-norm"]["status"] == "OK" and "b6" in checks["final-norm"]["message"]
    # speculators' own CLI trains with norm_before_residual true, which vLLM honours and SGLang ignores
    assert checks["norm-before-residual"]["status"] == "OK", checks["norm-before-residual"]
    rc, checks, _ = _doctor(draft, "sglang", export, models_root)
    assert rc == 3 and checks["aux-capture"]["status"] == "MISMATCH" and "no reader" in checks["aux-capture"]["message"]
    assert checks["norm-before-residual"]["status"] == "MISMATCH", checks["norm-before-residual"]
    # and a speculators draft checked against a SpecForge export: the last slot is the wrong final state
    spec_export, _, _ = trained("specforge")
    rc, checks, _ = _doctor(draft, "vllm", spec_export, models_root, "--no-load")
    assert rc == 3 and checks["final-norm"]["status"] == "MISMATCH"
