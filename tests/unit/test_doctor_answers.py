"""The doctor's `answers` check: a run extracted from a regeneration says who wrote its answers beside who captured
its features, and warns when another engine or dtype wrote them; a run of a prompt file's own answers has no such
check."""
from __future__ import annotations

import json

from pipeline.shards.manifest import read_manifest, write_manifest
from tests.helpers.drafts import make_draft
from tests.unit.test_doctor import findings, llama, run_dir, status, text  # noqa: F401 - llama is a fixture

HF = {"framework": "transformers", "framework_version": "5.19.0", "dtype": "bfloat16"}
VLLM = {"framework": "vllm", "framework_version": "0.32.0", "dtype": "bfloat16"}


def with_answers(path, engine):
    manifest = read_manifest(path)
    manifest["provenance"]["data"] = {"source": "regen", "sha256": "0" * 64,
                                      "regeneration": {"manifest_sha256": "1" * 64, "engine": engine}}
    (path / "manifest.json").unlink()
    write_manifest(path, json.loads(json.dumps(manifest)))
    return path


def test_answers_by_the_capture_engine_is_ok_and_another_engine_warns(tmp_path, llama):  # noqa: F811
    draft = make_draft(tmp_path / "d", llama, aux_ids=[0, 2, 4])
    points = ["b1", "b3", "b5", "final_norm"]
    plain = run_dir(tmp_path / "plain", points=points)
    assert status(findings(draft, run=plain), "answers") == set()
    same = with_answers(run_dir(tmp_path / "same", points=points), HF)
    assert status(findings(draft, run=same), "answers") == {"OK"}
    assert "answers by transformers 5.19.0 (bfloat16), features by transformers 5.19.0 (bfloat16)" in \
        text(findings(draft, run=same), "answers")
    other = with_answers(run_dir(tmp_path / "other", points=points), VLLM)
    found = findings(draft, run=other)
    assert status(found, "answers") == {"WARN"} and "answers by vllm 0.32.0" in text(found, "answers")
