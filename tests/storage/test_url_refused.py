"""A URL where a command takes a local path is refused in one line naming it, exit 2, nothing written: before, extract
with `out_dir=s3://runs/r1` wrote the local directory `./s3:/runs/r1` and exited 0, and verify reported its problems
"in s3:/runs/r1". (extract's out_dir and verify take `s3://` now: tests/storage/test_extract_to_s3.py; export's RUN
and doctor's --run: tests/exports/test_export_from_s3.py; regenerate's out_dir and the data.path of extract,
regenerate and the diff: tests/storage/test_regenerate_to_s3.py; export's --out, doctor's and accept's --export:
tests/exports/test_export_to_s3.py; a URL a path already swallowed, `s3:/runs/r1`, and a scheme other than s3 are
still refused.)"""
from __future__ import annotations

import subprocess
import sys

import pytest

COMMANDS = {
    "extract out_dir": ["pipeline.extract", "out_dir=s3:/runs/r1"],
    "verify": ["pipeline.verify", "s3:/runs/r1"],
    "export --out": ["pipeline.export", "run", "--format", "speculators", "--out", "s3:/runs/r1"],
    "accept --export": ["pipeline.accept", "--draft", "draft", "--serve", "vllm", "--export", "s3:/runs/r1",
                        "--prompts", "p.jsonl", "--out", "report"],
}


@pytest.mark.parametrize("case", COMMANDS)
def test_a_url_is_refused_not_read_as_a_relative_path(case, tmp_path):
    module, *args = COMMANDS[case]
    done = subprocess.run([sys.executable, "-m", module, *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    said = done.stdout + done.stderr  # the Hydra jobs log their error line to stdout
    lines = [line for line in said.splitlines() if "is a URL" in line]
    assert done.returncode == 2, said[-2000:]
    assert len(lines) == 1 and ("'s3://runs/r1" in lines[0] or "'s3:/runs/r1" in lines[0]), said[-2000:]
    assert "Traceback" not in said
    assert not (tmp_path / "s3:").exists()
    assert not [name for name in ("run", "export", "report") if (tmp_path / name).exists()]


@pytest.mark.parametrize("module", ["pipeline.extract", "pipeline.verify"])
def test_an_object_store_other_than_s3_is_refused_naming_the_scheme(module, tmp_path):
    args = ["out_dir=gs://runs/r1"] if module == "pipeline.extract" else ["gs://runs/r1"]
    done = subprocess.run([sys.executable, "-m", module, *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    said = done.stdout + done.stderr
    assert done.returncode == 2, said[-2000:]
    assert "the scheme 'gs' is not supported" in said and "Traceback" not in said
    assert list(tmp_path.iterdir()) == [] or [p.name for p in tmp_path.iterdir()] == ["logs"]
