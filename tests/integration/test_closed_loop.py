"""The closed loop at CI size (tests/helpers/loop.py): a draft trained by speculators' own CLI on our shards of the real
small model's own answers, served by vLLM with its target, measured from vLLM's counters. What it proves is the
wiring, with margins far wider than anything the CPU kind changes (float32 throughout): the target's answers are what
vLLM greedily generates, speculation never changes the output, a trained draft is accepted far more often than an
untrained one, the same draft fed the bottom three layers loses much of that, and the doctor names a one-layer shift
that serving would hide."""
from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from pipeline.core.cli import ExitCode
from tests.helpers.cli import cli
from tests.helpers.loop import ACCEPT_TOKENS, K, PROMPTS, QUESTIONS
from tests.helpers.markers import needs_vllm

# the first test here may build the closed loop (integration/conftest.py): 6 to 10 min on 2 cores, 15 seen
# with a bench sharing them; pyproject's 900 s would be too close
pytestmark = [pytest.mark.integration, needs_vllm, pytest.mark.timeout(2400)]


def _drafts(loop) -> dict[str, dict]:
    return {d["name"]: d for d in loop.report["drafts"]}


def _length(draft: dict) -> float:
    return draft["overall"]["acceptance_length"]


def test_the_figures_are_printed_with_each_doctors_verdict(closed_loop):
    lines = closed_loop.accept.stdout.splitlines()
    print("\n".join(lines))  # the measurement, in the test log
    for name, d in _drafts(closed_loop).items():
        line = next(x for x in lines if x.startswith(f"{name}: "))
        assert f"acceptance length {_length(d):.3f}" in line and f"doctor: {d['doctor']['verdict']}" in line


def test_speculation_never_changes_the_targets_own_greedy_answers(closed_loop):
    report = closed_loop.report
    assert report["num_prompts"] == len(PROMPTS) + len(QUESTIONS)
    manifest = json.loads((closed_loop.regen / "manifest.json").read_text())
    parts = [pq.read_table(closed_loop.regen / part["file"]).to_pylist() for part in manifest["parts"]]
    rows = sorted((r for part in parts for r in part), key=lambda r: r["row"])
    answers = [r["turns"][-1]["output_ids"][:ACCEPT_TOKENS] for r in rows]
    # what the drafter learnt is what the target, served, generates (same engine, same template, float32 greedy)
    assert [p["output_ids"] for p in report["plain"]["prompts"]] == answers
    for name, d in _drafts(closed_loop).items():
        assert d["differing"] == 0, name
        assert [p["output_ids"] for p in d["prompts"]] == answers, name
        assert d["overall"]["counts"]["draft_tokens"] == K * d["overall"]["counts"]["drafts"] > 0


def test_a_trained_draft_is_accepted_far_more_often_than_an_untrained_one(closed_loop):
    d = _drafts(closed_loop)
    trained, untrained = d["trained"], d["untrained"]
    assert trained["doctor"]["verdict"] == untrained["doctor"]["verdict"] == "OK"
    assert _length(untrained) < 1.1, untrained["overall"]  # a random draft: next to nothing accepted (1.000 seen)
    # seen: 2.365 and 2.918 (two seeds) against 1.000
    assert _length(trained) > _length(untrained) + 0.8, (trained["overall"], untrained["overall"])
    assert trained["overall"]["per_position"][0] > 0.3, trained["overall"]  # 0.554 and 0.689 seen
    assert trained["tokens_per_s"] > untrained["tokens_per_s"]


def test_the_bottom_three_layers_served_lose_much_of_it_and_the_doctor_says_so(closed_loop):
    d = _drafts(closed_loop)
    trained, bottom3 = d["trained"]["overall"], d["bottom3"]["overall"]
    assert d["bottom3"]["doctor"]["verdict"] == "MISMATCH"
    # seen: 2.365 against 1.740, and 2.918 against 1.673 (two seeds); deeper positions lose most (0.378 against
    # 0.090, 0.607 against 0.109): a draft that memorised its answers still guesses the next token from shallow layers
    assert trained["acceptance_length"] > bottom3["acceptance_length"] + 0.3, (trained, bottom3)
    assert trained["per_position"][-1] > 2 * bottom3["per_position"][-1], (trained, bottom3)


@pytest.mark.parametrize("name, served", [("shift+1", "b3,b16,b28"), ("shift-1", "b1,b14,b26")])
def test_the_doctor_names_a_one_layer_shift(closed_loop, name, served):
    done = cli("pipeline.doctor", "--draft", str(closed_loop.drafts[name]), "--serve", "vllm", "--export",
               str(closed_loop.export), "--no-load", "--json")
    report = json.loads(done.stdout)
    assert done.returncode == ExitCode.REFUSED and not report["ok"] and report["counts"]["MISMATCH"] == 1, report
    aux = next(c for c in report["checks"] if c["check"] == "aux-ids")
    assert aux["status"] == "MISMATCH" and served in aux["message"], aux
