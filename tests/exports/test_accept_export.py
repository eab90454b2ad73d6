"""`python -m pipeline.accept --export EXPORT`: the target and the features a draft was trained on are read from a real
export, and the doctor's verdict on each draft is settled before any engine starts (`prepare`: nothing served here;
tests/integration/test_accept.py serves drafts with vLLM)."""
from __future__ import annotations

import json

import pytest

from tests.exports.conftest import cli
from tests.helpers.drafts import accept_prepared


@pytest.mark.parametrize("states", ["copy", "reference"])  # a reference export's sidecar says the same
def test_the_target_and_the_trained_features_come_from_the_export(llama_run, models_root, tmp_path, states):
    export = tmp_path / "export"
    proc = cli("pipeline.export", str(llama_run), "--format", "speculators", "--out", str(export), "--states", states)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ids = json.loads((export / "export.json").read_text())["serving"]["vllm"]["aux_layer_ids"]
    plan, _, _ = accept_prepared(tmp_path, models_root, ids, export=export)
    assert plan.model_dir.resolve() == (models_root / "tiny-llama").resolve()
    assert [d.verdict for d in plan.doctors] == ["OK", "MISMATCH"], plan.doctors
    aux = [f for f in plan.doctors[1].findings if " aux-ids " in f]
    assert aux and aux[0].startswith("MISMATCH") and "b1,b3,b5" in aux[0], plan.doctors[1].findings
    assert len(plan.prompt_ids) == 1 and not (tmp_path / "out").exists()  # nothing written before measuring
