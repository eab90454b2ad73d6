"""`python -m pipeline.diff` as a user runs it: verdict table, report.json / report.md / report.html, and the HTML
rendered by headless Chromium without console errors (a screenshot is taken)."""
from __future__ import annotations

import json
import re
import subprocess

import pytest

from pipeline.compare.html import to_html
from pipeline.compare.serialize import from_dict, load
from pipeline.compare.job import run_diff
from tests.helpers.cli import cli
from tests.helpers.diff import SMALL_PROBE, diff_composed
from tests.helpers.markers import CHROMIUM, needs_chromium

pytestmark = [pytest.mark.integration, pytest.mark.slow]
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--enable-logging=stderr", "--v=0", "--window-size=1400,2400"]


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory, models_root):
    out = tmp_path_factory.mktemp("diff-cli") / "report"
    proc = cli("pipeline.diff", f"out_dir={out}", *SMALL_PROBE, f"hydra.run.dir={out.parent / 'logs'}")
    return out, proc


def test_the_default_diff_prints_a_verdict(cli_run):
    out, proc = cli_run
    assert proc.returncode == 0, proc.stderr[-3000:]  # warn is not a failure
    assert "diff verdict: WARN" in proc.stdout
    assert "hf@bfloat16 vs hf@float32" in proc.stdout and "routing flips" in proc.stdout
    assert f"report: {out.resolve()}/report.html" in proc.stdout


def test_report_files_parse(cli_run):
    out, _ = cli_run
    report = json.loads((out / "report.json").read_text())
    assert report["format"] == "pipeline.diff/1" and report["status"] == "warn"
    assert [e["label"] for e in report["engines"]] == ["hf@float32", "hf@bfloat16"]
    assert report["engines"][1]["info"]["dtype"] == "bfloat16" and report["model"]["moe_layers"] == list(range(2, 9))
    ref_pair = next(p for p in report["pairs"] if p["kind"] == "reference")
    assert ref_pair["routing_flips"] and len(ref_pair["points"]["b1"]["profile"]) == 64
    assert report["alignment"][0]["status"] == "ok" and len(report["alignment"][0]["distances"]) == 10
    md = (out / "report.md").read_text()
    assert md.startswith("# Cross-framework diff: WARN")
    assert "| point | status | rel L2 | p50 tok |" in md and "## Alignment: hf@bfloat16 against hf@float32 (ok)" in md
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 4  # overview, alignment, per-point, per-position
    assert "<script" not in html and "http://" not in html and "https://" not in html  # self-contained


@needs_chromium
def test_the_html_renders_in_headless_chromium(cli_run, tmp_path):
    out, _ = cli_run
    shot = tmp_path / "report.png"
    proc = subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
                           f"--screenshot={shot}", (out / "report.html").resolve().as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console
    assert shot.stat().st_size > 20_000  # a rendered page with plots, not a blank one
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_html_is_drawn_again_from_report_json(cli_run, tmp_path):
    """report.json holds all the HTML shows: drawn from it (later, on any machine) the plots are the same bytes."""
    out, _ = cli_run
    shown = (out / "report.html").read_text()
    again = to_html(from_dict(json.loads((out / "report.json").read_text())))
    images = re.compile(r'<img alt="plot" src="data:image/png;base64,[^"]+">')
    assert images.findall(again) == images.findall(shown) and len(images.findall(shown)) >= 4
    # the engines' times are kept to the millisecond in report.json: the one cell that may round differently
    timing = re.compile(r"<td>\d+\.\ds</td>")
    assert timing.sub("", images.sub("", again)) == timing.sub("", images.sub("", shown))
    # as a command, into a copy of the report directory
    (tmp_path / "report.json").write_bytes((out / "report.json").read_bytes())
    proc = cli("pipeline.compare.html", str(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == str((tmp_path / "report.html").resolve())
    assert images.findall((tmp_path / "report.html").read_text()) == images.findall(shown)


def test_drawing_html_from_a_directory_without_a_report_says_so(tmp_path):
    (tmp_path / "report.json").write_text('{"format": "something/else"}')
    for where, said in ((tmp_path / "none", "report.json: no such file"),
                        (tmp_path, "not a readable pipeline.diff/1 report (ValueError: format 'something/else'")):
        proc = cli("pipeline.compare.html", str(where), timeout=300)
        assert proc.returncode == 2 and said in proc.stderr, proc.stderr
    assert not (tmp_path / "report.html").exists()


def test_an_engine_that_cannot_start_is_reported_not_fatal(tmp_path, models_root):
    outcome = run_diff(diff_composed(f"out_dir={tmp_path}", *SMALL_PROBE, "diff.html=false",
                                "diff.engines=[{name:hf,label:broken,options:{python:/nowhere/bin/python}}]"))
    result = outcome.result
    assert result.status == "fail"
    assert result.failures[0].startswith("engine broken did not run: FileNotFoundError: engine='hf' runs in its own "
                                         "environment, but /nowhere/bin/python does not exist")
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["engines"][1]["error"] and report["status"] == "fail"
    drawn = to_html(load(tmp_path))  # a failed report is drawn from its report.json too
    assert 'Cross-framework diff: FAIL' in drawn and "engine broken did not run" in drawn
