"""A user's checkpoint never runs code it was not allowed to (issue 24, items 1 and 5), proven on real runs.

The checkpoint is the tiny Llama with its own code declared as a real one would: `config.json` auto_map ->
configuration_marker.py / modeling_marker.py, `tokenizer_config.json` auto_map -> tokenization_marker.py. Each module
appends its name to a marker file when it is imported, that is when it runs, in any process of the run. Only
`model.trust_remote_code=true` on the command line may make the marker appear: not the default model group (the tiny
K2.5, whose own tokenizer is the project's remote code and which sets the flag), not `model.build=null`, not a run
that is refused.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.io import sha256_file
from tests.helpers import REPO
from tests.helpers.runs import env_with, error_lines, output, verify

pytestmark = pytest.mark.reliability
POINTS = "model.points=[embed,2,final_norm]"
MODULES = ("configuration_marker.py", "modeling_marker.py", "tokenization_marker.py")
DECLARED = {"config.json": ["configuration_marker.py", "modeling_marker.py"],
            "tokenizer_config.json": ["tokenization_marker.py"]}
_BODIES = {
    "tokenization_marker.py": "from transformers import PreTrainedTokenizerFast\n\n\n"
                              "class MarkerTokenizer(PreTrainedTokenizerFast):\n    pass\n",
    "configuration_marker.py": "from transformers import LlamaConfig\n\n\nclass MarkerConfig(LlamaConfig):\n    pass\n",
    "modeling_marker.py": "from transformers import LlamaForCausalLM\n\n"
                          "from .configuration_marker import MarkerConfig\n\n\n"
                          "class MarkerForCausalLM(LlamaForCausalLM):\n    config_class = MarkerConfig\n",
}


def _write_checkpoint(out: Path, source: Path, marker: Path) -> Path:
    """A copy of the built tiny Llama (not a built model: no factory marker) declaring its own code."""
    shutil.copytree(source, out, ignore=shutil.ignore_patterns(".built.json"))
    for name, body in _BODIES.items():
        (out / name).write_text(f"import os\nwith open({str(marker)!r}, 'a') as f:\n"
                                f"    f.write('{name} ran in pid %d\\n' % os.getpid())\n{body}")
    for name, auto_map in (("tokenizer_config.json", {"AutoTokenizer": [None, "tokenization_marker.MarkerTokenizer"]}),
                           ("config.json", {"AutoConfig": "configuration_marker.MarkerConfig",
                                            "AutoModelForCausalLM": "modeling_marker.MarkerForCausalLM"})):
        config = json.loads((out / name).read_text())
        (out / name).write_text(json.dumps({**config, "auto_map": auto_map}, indent=2))
    return out


@pytest.fixture(scope="module")
def marker(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("marker") / "ran.txt"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tiny_model, marker) -> Path:
    return _write_checkpoint(tmp_path_factory.mktemp("user") / "my-ckpt", tiny_model("tiny-llama"), marker)


@pytest.fixture
def ran(marker):
    """What the marker says ran, read after the command (cleared before it)."""
    marker.unlink(missing_ok=True)
    return lambda: marker.read_text().splitlines() if marker.exists() else []


def _run(tmp_path: Path, *overrides: str, module: str = "pipeline.extract", flags: tuple[str, ...] = ()
         ) -> subprocess.CompletedProcess:
    """The real entry point in a child process; transformers copies remote code into its own cache, kept per test."""
    cmd = [sys.executable, "-m", module, *flags, f"out_dir={tmp_path / 'run'}", f"hydra.run.dir={tmp_path / 'logs'}",
           f"hydra.sweep.dir={tmp_path / 'sweep'}", *overrides]
    env = env_with(HF_MODULES_CACHE=str(tmp_path / "hf_modules"))
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def _warnings(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in output(done).splitlines() if "[WARNING]" in line]


def _remote_code(run: Path) -> tuple[dict, dict, dict]:
    manifest = json.loads((run / "manifest.json").read_text())
    record = json.loads((run / "run.json").read_text())
    return manifest["provenance"]["model"]["remote_code"], record["remote_code"], manifest["provenance"]["config"]


@pytest.mark.parametrize("extra", [("gate.mode=stop",), ("model.build=null", "gate.mode=off")],
                         ids=["path-and-points", "the-issues-own-steps"])
def test_a_users_checkpoint_starts_from_trust_off_and_its_declared_code_never_runs(tmp_path, checkpoint, ran, extra):
    """model.path without a model group: the default group (tiny K2.5: trust on, a build recipe, its points) does
    not apply; the checkpoint loads through the built-in classes (in the data stage, the gate's reference and the
    primary engine), one warning line names what did not run, and the provenance records the setting the user gave
    (none: off) and every declared file with its sha256. The issue's own steps (`model.build=null` and the points)
    ran the tokenizer's module and recorded trust_remote_code: true."""
    done = _run(tmp_path, f"model.path={checkpoint}", POINTS, "data.limit=2", *extra)
    assert done.returncode == 0, output(done)[-3000:]
    assert ran() == []
    (line,) = _warnings(done)
    assert "model.trust_remote_code is off" in line and "not run" in line
    assert all(name in line for name in MODULES), line
    in_manifest, in_run_json, config = _remote_code(tmp_path / "run")
    expected = {"trust_remote_code": False, "files_sha256": {}, "declared": DECLARED,
                "not_run_sha256": {name: sha256_file(checkpoint / name) for name in MODULES}}
    assert in_manifest == expected and in_run_json == expected
    assert config["model"] == {"name": "local", "path": str(checkpoint), "build": None, "trust_remote_code": False,
                               "points": ["embed", 2, "final_norm"], "sampling": {}}
    checked = verify(tmp_path / "run")  # the shards' compact provenance carries the files not run, and agrees
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_only_trust_remote_code_true_on_the_command_line_runs_it(tmp_path, checkpoint, ran):
    done = _run(tmp_path, f"model.path={checkpoint}", POINTS, "model.trust_remote_code=true", "data.limit=2",
                "gate.mode=off")
    assert done.returncode == 0, output(done)[-3000:]
    assert {line.split()[0] for line in ran()} == set(MODULES)  # tokenizer, config and model classes all ran
    assert _warnings(done) == []
    in_manifest, in_run_json, config = _remote_code(tmp_path / "run")
    expected = {"trust_remote_code": True, "files_sha256": {name: sha256_file(checkpoint / name) for name in MODULES},
                "declared": DECLARED, "not_run_sha256": {}}
    assert in_manifest == expected and in_run_json == expected
    assert config["model"]["trust_remote_code"] is True


@pytest.mark.parametrize("extra", [(), ("model.build=null",)], ids=["path-alone", "build-null"])
def test_model_path_alone_asks_for_the_capture_points(tmp_path, checkpoint, ran, extra):
    """What the issue's user tried first: no tiny-model recipe refusal, no out-of-range default points, but the one
    thing the user must still say, with this checkpoint's layer count."""
    done = _run(tmp_path, f"model.path={checkpoint}", *extra)
    assert done.returncode == 2, output(done)[-3000:]
    (line,) = error_lines(done)
    assert line.endswith(f"configuration error: capture.points=[]: no capture points are named for "
                         f"model.path='{checkpoint}' (your own checkpoint inherits none): name them, e.g. "
                         f"model.points=[embed,2,3,final_norm] (boundary k = the residual stream after k of its 6 "
                         f"decoder layers, 0..6; embed = 0; final_norm = the LM head's input)"), line
    assert "Traceback" not in output(done) and not (tmp_path / "run").exists() and ran() == []


@pytest.mark.parametrize("group", ["model=tiny_llama", "model=tiny_k25_int4_8l", "+exp=tiny"])
def test_a_tiny_model_group_given_another_checkpoint_is_refused_saying_what_to_write(tmp_path, checkpoint, ran,
                                                                                     group):
    done = _run(tmp_path, group, f"model.path={checkpoint}", POINTS)
    assert done.returncode == 2, output(done)[-3000:]
    # refused while the command is composed, before Hydra's job starts: one line on stderr, not a job log line
    (line,) = [text for text in output(done).splitlines() if "configuration error" in text]
    assert "Traceback" not in output(done)
    assert f"configuration error: model.path='{checkpoint}' is not named after its recipe" in line
    assert f"For your own checkpoint write model=local model.path={checkpoint} model.points=[...]" in line
    assert "to build '" in line and "model.path=<a directory>/tiny-" in line
    assert not (tmp_path / "run").exists() and ran() == []


def test_under_hydra_multirun_the_default_group_is_refused_for_a_users_checkpoint(tmp_path, checkpoint, ran):
    """`-m` leaves the overrides to Hydra (nothing rewrites them): the job itself refuses the default's settings."""
    done = _run(tmp_path, f"model.path={checkpoint}", POINTS, flags=("-m",))
    assert done.returncode == 2, output(done)[-3000:]
    (line,) = error_lines(done)
    assert line.endswith(f"write model=local model.path={checkpoint} model.points=[...]"), line
    assert "the default model group 'tiny_k25_int4_8l'" in line
    assert not (tmp_path / "run").exists() and ran() == []


@pytest.fixture(params=["no-built-in-class", "built-in-class-cannot-read"])
def unreadable(request, tmp_path, tiny_model, marker) -> tuple[Path, str]:
    """A checkpoint whose tokenizer only its own code reads: a tokenizer class transformers lacks (refused before any
    load), or a built-in class without the file it reads (refused when it fails to load)."""
    out = _write_checkpoint(tmp_path / "unreadable", tiny_model("tiny-llama"), marker)
    if request.param == "no-built-in-class":
        config = json.loads((out / "tokenizer_config.json").read_text())
        (out / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "MarkerTokenizer"}))
        return out, ("loads only by running its own Python code, refused: model.trust_remote_code is off and "
                     "transformers has no built-in tokenizer class 'MarkerTokenizer' to read it instead "
                     "(tokenizer_config.json auto_map -> tokenization_marker.py); set model.trust_remote_code=true "
                     "if you trust that code")
    (out / "tokenizer.json").rename(out / "marker_vocab.json")  # what only MarkerTokenizer would know to read
    return out, ("its tokenizer declares its own code (tokenizer_config.json auto_map -> tokenization_marker.py), "
                 "not run since model.trust_remote_code is off, and the built-in tokenizer class cannot read it "
                 "(ValueError: ")


def test_declared_code_the_built_in_classes_cannot_read_is_refused_naming_it(tmp_path, unreadable, ran):
    path, message = unreadable
    done = _run(tmp_path, f"model.path={path}", POINTS)
    assert done.returncode == 2, output(done)[-3000:]
    (line,) = error_lines(done)
    assert f"configuration error: model.path='{path}'" in line and message in line, line
    assert _warnings(done) == [] and "Traceback" not in output(done)
    assert not (tmp_path / "run").exists() and ran() == []


def test_the_diff_takes_a_users_checkpoint_the_same_way(tmp_path, checkpoint, ran):
    done = _run(tmp_path, f"model.path={checkpoint}", "diff.probe.num_samples=2", "diff.probe.alone=0",
                "diff.probe.repeats=1", "diff.html=false", module="pipeline.diff")
    assert done.returncode == 0, output(done)[-3000:]
    assert ran() == []
    (line,) = _warnings(done)
    assert all(name in line for name in MODULES), line
