"""What a user's console shows when the HF loader reads the text model out of the tiny Kimi-K2.5 wrapper (the embedded
default): the wrapper's vision weights, left unread by design, are one line instead of transformers' UNEXPECTED table;
a checkpoint with a text weight missing or extra still gets transformers' whole report (and a missing one is refused).
Each load runs in a child process, so the console is the real one: transformers' own handler and the logging setup
of an entry point."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from tests.helpers import REPO

pytestmark = [pytest.mark.integration]
DEFAULT = "tiny-k25-int4-8l"
LOAD = """
import logging, sys
logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
from pipeline.models.hf_text import load_text_model
try:
    load_text_model(sys.argv[1])
except ValueError as exc:
    print("refused:", exc)
"""


def _console(model_dir: Path) -> str:
    # Without CI in the environment: with CI=true (as the test command runs in CI) transformers propagates its records
    # to the root logger as well (transformers/utils/logging.py), so every one of its lines would show twice here.
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    done = subprocess.run([sys.executable, "-c", LOAD, str(model_dir)], cwd=REPO, capture_output=True, text=True,
                          timeout=300, check=False, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


def _edited_copy(source: Path, dest: Path, edit) -> Path:
    """The checkpoint with its weights file rewritten as edit(tensors) (its metadata kept)."""
    shutil.copytree(source, dest)
    with safe_open(source / "model.safetensors", "pt") as f:
        tensors, metadata = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    save_file(edit(tensors), dest / "model.safetensors", metadata=metadata)
    return dest


def test_the_wrappers_vision_weights_are_one_line(tiny_model):
    path = tiny_model(DEFAULT)
    with safe_open(path / "model.safetensors", "pt") as f:
        outside = [k for k in f.keys() if not k.startswith("language_model.")]
    parts = {part: sum(k.startswith(f"{part}.") for k in outside) for part in ("mm_projector", "vision_tower")}
    assert sum(parts.values()) == len(outside) > 0  # the wrapper holds nothing else outside its text model
    console = _console(path)
    assert "UNEXPECTED" not in console and "LOAD REPORT" not in console, console
    summary = (f"pipeline.models.load_report: skipped {len(outside)} weights of the kimi_k25 checkpoint outside its "
               f"text model (mm_projector: {parts['mm_projector']}, vision_tower: {parts['vision_tower']}): the text "
               "model does not use them")
    assert console.splitlines().count(summary) == 1, console


def test_a_missing_text_weight_is_reported_whole_and_refused(tiny_model, tmp_path):
    gone = "language_model.model.norm.weight"
    path = _edited_copy(tiny_model(DEFAULT), tmp_path / "ckpt", lambda t: {k: v for k, v in t.items() if k != gone})
    console = _console(path)
    assert "LOAD REPORT" in console and "skipped" not in console, console
    rows = [[cell.strip() for cell in line.split("|")[:2]] for line in console.splitlines() if "|" in line]
    assert [row for row in rows if row[1] == "MISSING"] == [["model.norm.weight", "MISSING"]], console
    assert "UNEXPECTED" in console  # the report is given back as transformers wrote it, vision rows included
    assert "refused: model.path=" in console and "did not load 1 weight(s), e.g. ['model.norm.weight']" in console


def test_an_unexpected_text_weight_is_reported_whole(tiny_model, tmp_path):
    extra = "language_model.model.layers.0.stray.weight"
    path = _edited_copy(tiny_model(DEFAULT), tmp_path / "ckpt", lambda t: {**t, extra: torch.ones(4)})
    console = _console(path)
    assert "LOAD REPORT" in console and "skipped" not in console and "refused" not in console, console
    rows = [[cell.strip() for cell in line.split("|")[:2]] for line in console.splitlines() if "|" in line]
    assert ["model.layers.0.stray.weight", "UNEXPECTED"] in rows, console
