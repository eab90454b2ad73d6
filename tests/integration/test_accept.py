"""`python -m pipeline.accept` against real vLLM on the real small model (SmolLM2-135M-Instruct), float32, greedy. The
report is the closed loop's measurement (tests/integration/conftest.py): three speculators-format drafts side by side,
one trained on the target's own answers, one random, one fed the wrong layers. Proven here: vLLM loads and runs the
drafts, speculative output equals plain greedy output, the report's figures follow from the raw counters it saved,
the report directory keeps a finished report, and what vLLM (or SGLang here) cannot serve is one line and an exit
code. What the figures say about the drafts is test_closed_loop.py's."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import accept as accept_cli
from pipeline.core.cli import ExitCode
from tests.helpers.drafts import make_draft
from tests.helpers.loop import K, PROMPTS
from tests.helpers.markers import needs_vllm

# the first test here may build the closed loop (integration/conftest.py): 6 to 10 min on 2 cores, 15 seen
# with a bench sharing them; pyproject's 900 s would be too close
pytestmark = [pytest.mark.integration, needs_vllm, pytest.mark.timeout(2400)]
REPO = Path(__file__).resolve().parents[2]
SERVED = ["trained", "untrained", "bottom3"]  # the closed loop's drafts, in the order it served them


def accept(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline.accept", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=1500, env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.fixture(scope="module")
def smol(tiny_model):
    return tiny_model("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def setup(smol, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("accept")
    config = json.loads((smol / "config.json").read_text())
    drafts = [make_draft(tmp / "a", config, schema="speculators", aux_ids=[2, 15, 27])]
    prompts = tmp / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return tmp, config, drafts, prompts


@pytest.fixture(scope="module")
def measured(closed_loop):
    return closed_loop.accept, closed_loop.report, closed_loop.accept_out


def test_three_drafts_side_by_side_with_speculative_output_equal_to_plain_greedy(measured):
    done, report, out = measured
    assert [d["name"] for d in report["drafts"]] == SERVED
    for d in report["drafts"]:
        assert d["differing"] == 0, [(r["output_ids"], p["output_ids"])
                                     for r, p in zip(d["prompts"], report["plain"]["prompts"])]
        assert d["speculative_config"] == {"method": "eagle3", "model": str(Path(d["speculative_config"]["model"])),
                                           "num_speculative_tokens": K}
        assert d["overall"]["counts"]["drafts"] > 0  # vLLM really speculated
        assert d["tokens_per_s"] > 0
    assert [d["doctor"]["verdict"] for d in report["drafts"]] == ["OK", "OK", "MISMATCH"]
    md = (out / "report.md").read_text()
    assert "| | `trained` | `untrained` | `bottom3` |" in md and "acceptance length" in md
    assert "accepted at position 3" in md
    page = (out / "report.html").read_text()
    assert page.count('<img alt="per-position acceptance" src="data:image/png;base64,') == 1
    assert "<th>trained</th><th>untrained</th><th>bottom3</th>" in page and "accepted at position 3" in page
    assert "http" not in page
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "report.json", "report.md"]
    assert [line.split(":")[0] for line in done.stdout.splitlines()[:3]] == SERVED
    prov = report["provenance"]
    assert prov["vllm_version"] == "0.32.0" and len(prov["prompts"]["sha256"]) == 64
    assert all("model.safetensors" in d["files"] for d in prov["drafts"])


def test_every_figure_follows_from_the_saved_raw_counters(measured):
    _, report, _ = measured
    for d in report["drafts"]:
        totals = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "accepted_per_pos": [0] * K}
        for row in d["prompts"]:
            b, a = row["counters_before"], row["counters_after"]
            drafts, tokens, accepted = (a[k] - b[k] for k in ("drafts", "draft_tokens", "accepted"))
            per_pos = [x - y for x, y in zip(a["accepted_per_pos"], b["accepted_per_pos"])]
            assert tokens == K * drafts and sum(per_pos) == accepted  # vLLM's own invariants
            assert row["acceptance_length"] == pytest.approx(1 + accepted / drafts)
            assert row["per_position"] == pytest.approx([p / drafts for p in per_pos])
            assert row["draft_token_rate"] == pytest.approx(accepted / tokens)
            totals = {"drafts": totals["drafts"] + drafts, "draft_tokens": totals["draft_tokens"] + tokens,
                      "accepted": totals["accepted"] + accepted,
                      "accepted_per_pos": [x + y for x, y in zip(totals["accepted_per_pos"], per_pos)]}
        o = d["overall"]
        assert o["counts"] == totals
        assert o["acceptance_length"] == pytest.approx(1 + totals["accepted"] / totals["drafts"])
        assert o["per_position"] == pytest.approx([p / totals["drafts"] for p in totals["accepted_per_pos"]])
        seconds = sum(r["seconds"] for r in d["prompts"])
        assert d["tokens_per_s"] == pytest.approx(sum(r["output_tokens"] for r in d["prompts"]) / seconds)


def test_a_finished_report_is_kept_unless_overwrite_is_given(measured, setup, smol, capsys):
    _, _, out = measured
    _, _, drafts, prompts = setup
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    code = accept_cli.main(["--draft", str(drafts[0]), "--serve", "vllm", "--target", str(smol), "--prompts",
                            str(prompts), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE and err.count("\n") == 1 and "pass --overwrite" in err, err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_sglang_is_refused_in_one_line_saying_why(setup, smol):
    tmp, _, drafts, prompts = setup
    done = accept("--draft", str(drafts[0]), "--serve", "sglang", "--target", str(smol), "--prompts", str(prompts),
                  "--out", str(tmp / "sg"), cwd=tmp)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "copy_all_layer_kv_cache_cpu" in done.stderr and not (tmp / "sg").exists()


def test_a_draft_without_config_is_a_usage_error_in_one_line(setup, smol):
    tmp, config, _, prompts = setup
    broken = make_draft(tmp / "broken", config, schema="speculators")
    (broken / "config.json").unlink()
    done = accept("--draft", str(broken), "--serve", "vllm", "--target", str(smol), "--prompts", str(prompts),
                  "--out", str(tmp / "x"), cwd=tmp)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr[-2000:]
    assert "config.json" in done.stderr and not (tmp / "x").exists()


def test_a_draft_vllm_refuses_to_load_is_a_usage_error_in_one_line(setup, smol):
    tmp, config, _, prompts = setup
    misnamed = make_draft(tmp / "misnamed", config, aux_ids=[2, 15, 27], prefix="draft_model.layers.0")
    done = accept("--draft", str(misnamed), "--serve", "vllm", "--target", str(smol), "--prompts", str(prompts),
                  "--out", str(tmp / "y"), "--max-tokens", "4", cwd=tmp)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1, done.stderr[-3000:]
    assert errors[0].startswith(f"error: vLLM refused draft {misnamed}: ") and not (tmp / "y").exists()


def test_an_out_dir_inside_a_run_is_refused(setup, smol):
    tmp, _, drafts, prompts = setup
    run = tmp / "run"
    run.mkdir()
    (run / "run.json").write_text("{}")
    done = accept("--draft", str(drafts[0]), "--serve", "vllm", "--target", str(smol), "--prompts", str(prompts),
                  "--out", str(run / "acc"), cwd=tmp)
    assert done.returncode == 2 and "inside the run directory" in done.stderr, done.stderr


def test_a_draft_vllm_loads_and_then_fails_on_is_one_line_and_the_others_are_still_measured(measured, closed_loop):
    done, report, out = measured
    failing = closed_loop.drafts["d2t-past-vocab"]  # every draft token mapped past the target's vocabulary
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == ExitCode.FAILED and len(errors) == 1, done.stderr[-3000:]
    assert errors[0].startswith(f"error: vLLM failed while serving draft {failing}: ") and "IndexError" in errors[0]
    assert "Traceback" not in done.stderr
    assert [(f["name"], f["exit_code"], f["doctor"]["verdict"]) for f in report["failed"]] == [
        ("d2t-past-vocab", ExitCode.FAILED, "MISMATCH")]  # the doctor: d2t does not give the ids t2d marks
    assert report["failed"][0]["error"] == errors[0].removeprefix("error: ")
    assert [d["name"] for d in report["drafts"]] == SERVED and len(report["provenance"]["drafts"]) == len(SERVED)
    assert f"- `d2t-past-vocab` not measured (exit 1): vLLM failed while serving draft {failing}" in (
        out / "report.md").read_text()
    assert "<h2>Not measured</h2>" in (out / "report.html").read_text()
