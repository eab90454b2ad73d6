"""Every JSON file the commands read, wrong in type, nesting or size (issue 24, items 4 and 8), on real files: each is
exit status 2 and one `error:` line naming the file and the field, never a traceback (pipeline/core/jsonfile.py).
The doctor reads every draft config field it uses by type, and names non-finite weights as their own problem.

Drafts are built by tests/helpers/drafts.py over the tiny Llama's config; runs are one real extract of the tiny
default (tests/reliability/conftest.py), copied for each case; deeply nested files run the command in a child process
(a RecursionError there used to end it with a traceback).
"""
from __future__ import annotations

import json
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from pipeline import doctor, export, verify
from pipeline.core.cli import ExitCode
from pipeline.core.jsonfile import MAX_BYTES, MAX_DEPTH
from tests.helpers.cli import cli
from tests.helpers.drafts import make_draft
from tests.helpers.runs import extract, output

pytestmark = pytest.mark.reliability
DEEP = "[" * 100_000 + "]" * 100_000  # far past the parser's recursion limit: a RecursionError before the fix


def _nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth - 1):
        value = {"x": value}
    return value


@pytest.fixture(scope="module")
def llama(models_root) -> dict:
    return json.loads((models_root / "tiny-llama" / "config.json").read_text())


@pytest.fixture
def run(finished, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(finished, copy, symlinks=True)
    return copy


def edit_json(path: Path, edit) -> None:
    value = json.loads(path.read_text())
    edit(value)
    path.write_text(json.dumps(value))


def one_error(capsys, code: int, main, *argv: str) -> str:
    """The entry point's exit status is `code` and it printed one stderr line: that line."""
    capsys.readouterr()
    assert main(list(argv)) == code
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def one_line(done: subprocess.CompletedProcess, code: int) -> str:
    """A child process's exit status is `code`, its stderr one line and no traceback: that line."""
    assert done.returncode == code and "Traceback" not in output(done), output(done)[-3000:]
    lines = done.stderr.splitlines()
    assert len(lines) == 1, lines
    return lines[0]


# --- the doctor: every draft config field it uses, by type --------------------------------------------------------

DRAFT_FIELDS = {  # config edit -> the message after "<draft>/config.json: "
    "architectures": (lambda c: c.update(architectures=5), "architectures must be an array, got 5"),
    "architecture": (lambda c: c.update(architectures=["LlamaForCausalLMEagle3", 7]),
                     "architectures[1] must be a string, got 7"),
    "hidden_size-text": (lambda c: c.update(hidden_size="abc"), "hidden_size must be an integer, got 'abc'"),
    "hidden_size-null": (lambda c: c.update(hidden_size=None), "hidden_size must be an integer, got null"),
    "hidden_size-missing": (lambda c: c.pop("hidden_size"), "hidden_size is missing (it must be an integer)"),
    "hidden_size-bool": (lambda c: c.update(hidden_size=True), "hidden_size must be an integer, got true"),
    "hidden_size-float": (lambda c: c.update(hidden_size=256.0), "hidden_size must be an integer, got 256.0"),
    "draft_vocab_size": (lambda c: c.update(draft_vocab_size="many"), "draft_vocab_size must be an integer, got "
                         "'many'"),
    "draft_vocab_size-zero": (lambda c: c.update(draft_vocab_size=0), "draft_vocab_size must be an integer >= 1, "
                              "got 0"),
    "vocab_size": (lambda c: c.update(vocab_size=[4096]), "vocab_size must be an integer, got [4096]"),
    "target_hidden_size": (lambda c: c.update(target_hidden_size="256"), "target_hidden_size must be an integer, "
                           "got '256'"),
    "eagle_config": (lambda c: c.update(eagle_config=[1, 2]), "eagle_config must be an object, got [1, 2]"),
    "aux-ids": (lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[0, "two", 4]),
                "eagle_config.eagle_aux_hidden_state_layer_ids[1] must be an integer, got 'two'"),
    "aux-ids-top": (lambda c: c.update(eagle_aux_hidden_state_layer_ids="0,2,4"),
                    "eagle_aux_hidden_state_layer_ids must be an array, got '0,2,4'"),
    "use_aux": (lambda c: c["eagle_config"].update(use_aux_hidden_state="no"),
                "eagle_config.use_aux_hidden_state must be true or false, got 'no'"),
    "num_aux": (lambda c: c.update(num_aux_hidden_states="3"), "num_aux_hidden_states must be an integer, got '3'"),
    "norm_output": (lambda c: c.update(norm_output="yes"), "norm_output must be true or false, got 'yes'"),
    "norm_before_residual": (lambda c: c.update(norm_before_residual=1),
                             "norm_before_residual must be true or false, got 1"),
}


@pytest.mark.parametrize("case", sorted(DRAFT_FIELDS))
def test_a_wrong_typed_draft_field_is_named_with_exit_2(tmp_path, llama, models_root, capsys, case):
    edit, message = DRAFT_FIELDS[case]
    draft = make_draft(tmp_path / "d", llama, aux_ids=[0, 2, 4])
    edit_json(draft / "config.json", edit)
    for load in ("--no-load",), ():  # the config is read before anything is loaded
        line = one_error(capsys, ExitCode.USAGE, doctor.main, "--draft", str(draft), "--serve", "sglang",
                         "--target", str(models_root / "tiny-llama"), *load)
        assert line == f"error: {draft / 'config.json'}: {message}"


def test_a_speculators_layer_config_field_is_named_with_its_path(tmp_path, llama, models_root, capsys):
    draft = make_draft(tmp_path / "d", llama, schema="speculators", aux_ids=[0, 2, 4])
    edit_json(draft / "config.json", lambda c: c["transformer_layer_config"].update(hidden_size="abc"))
    line = one_error(capsys, ExitCode.USAGE, doctor.main, "--draft", str(draft), "--serve", "vllm", "--no-load",
                     "--target", str(models_root / "tiny-llama"))
    assert line == f"error: {draft / 'config.json'}: transformer_layer_config.hidden_size must be an integer, got 'abc'"
    edit_json(draft / "config.json", lambda c: c.update(speculators_model_type=3))
    line = one_error(capsys, ExitCode.USAGE, doctor.main, "--draft", str(draft), "--serve", "vllm", "--no-load",
                     "--target", str(models_root / "tiny-llama"))
    assert line == f"error: {draft / 'config.json'}: speculators_model_type must be a string, got 3"


def test_a_deeply_nested_or_huge_draft_config_is_one_line(tmp_path, llama, models_root):
    draft = make_draft(tmp_path / "d", llama, aux_ids=[0, 2, 4])
    config = draft / "config.json"
    args = ("--draft", str(draft), "--serve", "sglang", "--no-load", "--target", str(models_root / "tiny-llama"))
    config.write_text(json.dumps({**json.loads(config.read_text()), "rope_scaling": "@"}).replace('"@"', DEEP))
    assert one_line(cli("pipeline.doctor", *args), ExitCode.USAGE) == \
        f"error: {config} nests arrays or objects deeper than {MAX_DEPTH} levels"
    config.write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"], "pad": "x" * MAX_BYTES}))
    assert one_line(cli("pipeline.doctor", *args), ExitCode.USAGE) == \
        f"error: {config} is larger than {MAX_BYTES} bytes, the most read for it"


def test_nesting_inside_strings_and_at_the_bound_is_read(tmp_path, llama, models_root, capsys):
    """Brackets in a string are no nesting, and a document exactly MAX_DEPTH deep is read: only deeper is refused."""
    draft = make_draft(tmp_path / "d", llama, aux_ids=[0, 2, 4], draft_vocab=1024)
    args = ["--draft", str(draft), "--serve", "sglang", "--no-load", "--target", str(models_root / "tiny-llama")]
    edit_json(draft / "config.json", lambda c: c.update(note="[{" * 1000 + '\\"', extra=_nested(MAX_DEPTH - 1)))
    assert doctor.main(args) == ExitCode.OK, capsys.readouterr().err
    edit_json(draft / "config.json", lambda c: c.update(extra=_nested(MAX_DEPTH)))
    assert "deeper than 64 levels" in one_error(capsys, ExitCode.USAGE, doctor.main, *args)


def test_the_targets_files_are_read_by_type(tmp_path, llama, models_root, finished, capsys):
    draft = make_draft(tmp_path / "d", llama, aux_ids=[0, 2, 4])
    target = tmp_path / "target"
    shutil.copytree(models_root / "tiny-llama", target)
    edit_json(target / "config.json", lambda c: c.update(num_hidden_layers="six"))
    line = one_error(capsys, ExitCode.USAGE, doctor.main, "--draft", str(draft), "--serve", "sglang", "--no-load",
                     "--target", str(target))
    assert line == f"error: --target: {target / 'config.json'}: num_hidden_layers must be an integer, got 'six'"
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    edit_json(run / "manifest.json", lambda m: m["provenance"]["engine"].update(quantization="int4"))
    line = one_error(capsys, ExitCode.USAGE, doctor.main, "--draft", str(draft), "--serve", "sglang", "--no-load",
                     "--run", str(run))
    assert line == (f"error: --run: manifest {run / 'manifest.json'}: provenance.engine.quantization must be an "
                    "object, got 'int4'")
    exported = tmp_path / "export"
    exported.mkdir()
    (exported / "export.json").write_text(json.dumps({
        "format": "specforge", "model": {"model_type": "llama", "num_layers": 6}, "run_points": ["b1", "b6"],
        "slots": [{"slot": 0, "role": "aux", "point": 1}]}))
    line = one_error(capsys, ExitCode.USAGE, doctor.main, "--draft", str(draft), "--serve", "sglang", "--no-load",
                     "--export", str(exported))
    assert line.endswith(f"{exported / 'export.json'}: slots[0].point must be a string, got 1")


def test_a_deeply_nested_speculative_config_is_a_flags_finding(tmp_path, llama, models_root, capsys):
    draft = make_draft(tmp_path / "d", llama, aux_ids=[1, 3, 5])
    assert doctor.main(["--draft", str(draft), "--serve", "vllm", "--no-load", "--target",
                        str(models_root / "tiny-llama"), "--server-args", f"--speculative-config '{DEEP}'"]) == 3
    flags = [line for line in capsys.readouterr().out.splitlines() if line.split()[1] == "flags"]
    assert len(flags) == 1 and flags[0].startswith("MISMATCH flags --speculative-config is not JSON (the value "
                                                   f"nests arrays or objects deeper than {MAX_DEPTH} levels)")


# --- the doctor: non-finite weights, their own problem ------------------------------------------------------------

def _poison(draft: Path, value: float, names: tuple[str, ...] | None = None) -> None:
    """Fill the draft's floating-point tensors (`names`, default every one) with `value`, or one element of each."""
    tensors = load_file(str(draft / "model.safetensors"))
    for name, t in tensors.items():
        if t.is_floating_point() and (names is None or name in names):
            if names is None:
                t.fill_(value)
            else:
                t.view(-1)[7] = value
    save_file(tensors, str(draft / "model.safetensors"))


def _doctor(capsys, *argv: str) -> tuple[int, dict[str, list[tuple[str, str]]]]:
    """The doctor's exit status and its findings by check: [(status, message)]."""
    capsys.readouterr()
    code = doctor.main(list(argv))
    found: dict[str, list[tuple[str, str]]] = {}
    for line in capsys.readouterr().out.splitlines()[:-1]:  # the last line is the summary
        status, check, message = line.split(None, 2)
        found.setdefault(check, []).append((status, message))
    return code, found


@pytest.mark.parametrize("load", [True, False], ids=["with-load", "no-load"])
def test_an_all_nan_draft_is_named_non_finite_not_fine_or_misnamed(tmp_path, llama, models_root, capsys, load):
    draft = make_draft(tmp_path / "d", llama, aux_ids=[0, 2, 4], draft_vocab=1024)
    args = ["--draft", str(draft), "--serve", "sglang", "--target", str(models_root / "tiny-llama")]
    if not load:  # (the sound draft with a load is the engine tests' case: tests/integration/test_doctor_engines.py)
        args.append("--no-load")
        code, found = _doctor(capsys, *args)
        assert code == ExitCode.OK and found["finite"] == [
            ("OK", "every floating-point value of the draft's 15 tensors is finite")]
    _poison(draft, float("nan"))
    code, found = _doctor(capsys, *args)
    assert code == ExitCode.REFUSED
    assert found["finite"] == [("ERROR", "13 of the draft's 15 tensors hold non-finite values: fc.weight (196608 NaN "
                                "of 196608), lm_head.weight (262144 NaN of 262144), midlayer.hidden_norm.weight (256 "
                                "NaN of 256), midlayer.input_layernorm.weight (256 NaN of 256), "
                                "midlayer.mlp.down_proj.weight (196608 NaN of 196608), midlayer.mlp.gate_proj.weight "
                                "(196608 NaN of 196608) ...; a server would serve them as they are (every proposed "
                                "token garbage): re-save the draft from a checkpoint without NaN/inf")]
    if load:  # the load probe's sentinel is NaN: it is not run on a NaN draft (it would call every tensor dropped)
        assert found["weights"] == [("WARN", "not loaded into sglang 0.5.23's LlamaForCausalLMEagle3: the draft holds "
                                     "NaN (see finite), which the load probe cannot tell from the parameters a "
                                     "loader leaves unset; weight names not proven until the weights are finite")]
    else:
        assert "weights" not in found


def test_one_inf_and_one_nan_are_counted_where_they_are(tmp_path, llama, models_root, capsys):
    draft = make_draft(tmp_path / "d", llama, aux_ids=[0, 2, 4], draft_vocab=1024)
    _poison(draft, float("inf"), ("norm.weight",))
    _poison(draft, float("-inf"), ("midlayer.mlp.up_proj.weight",))
    tensors = load_file(str(draft / "model.safetensors"))
    tensors["fc.weight"] = tensors["fc.weight"].to(torch.bfloat16)
    tensors["fc.weight"][3, 5] = float("nan")
    save_file(tensors, str(draft / "model.safetensors"))
    code, found = _doctor(capsys, "--draft", str(draft), "--serve", "sglang", "--no-load", "--target",
                          str(models_root / "tiny-llama"))
    assert code == ExitCode.REFUSED
    assert found["finite"] == [("ERROR", "3 of the draft's 15 tensors hold non-finite values: fc.weight (1 NaN of "
                                "196608), midlayer.mlp.up_proj.weight (1 inf of 196608), norm.weight (1 inf of 256); "
                                "a server would serve them as they are (every proposed token garbage): re-save the "
                                "draft from a checkpoint without NaN/inf")]


# --- verify and export: the run's manifest, run.json and an export's files ----------------------------------------

MANIFEST_FIELDS = {  # manifest edit -> the message after "manifest <run>/manifest.json: "
    "hidden_size": (lambda m: m.update(hidden_size="abc"), "hidden_size must be an integer, got 'abc'"),
    "points": (lambda m: m.update(points="b1,b4"), "points must be an array, got 'b1,b4'"),
    "shard": (lambda m: m["shards"].__setitem__(0, "shard-00000"), "shards[0] must be an object, got 'shard-00000'"),
    "num_samples": (lambda m: m.update(num_samples=None), "num_samples must be an integer, got null"),
    "model": (lambda m: m["provenance"].update(model=["tiny"]), "provenance.model must be an object, got ['tiny']"),
    "num_layers": (lambda m: m["provenance"]["model"].update(num_layers="8"),
                   "provenance.model.num_layers must be an integer, got '8'"),
}


@pytest.mark.parametrize("case", sorted(MANIFEST_FIELDS))
def test_a_wrong_typed_manifest_field_is_named_by_verify_and_export(run, tmp_path, capsys, case):
    edit, message = MANIFEST_FIELDS[case]
    edit_json(run / "manifest.json", edit)
    named = f"manifest {run / 'manifest.json'}: {message}"
    assert one_error(capsys, ExitCode.USAGE, verify.main, str(run)) == f"error: {named}"
    line = one_error(capsys, ExitCode.USAGE, export.main, str(run), "--format", "specforge", "--out",
                     str(tmp_path / "out"))
    assert line == f"error: not a finished run: {named}"
    assert not (tmp_path / "out").exists()


def test_a_deeply_nested_manifest_is_one_line_in_verify_export_and_doctor(run, tmp_path, llama):
    manifest = run / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"provenance": {', f'"deep": {DEEP}, "provenance": {{', 1))
    named = f"manifest {manifest} nests arrays or objects deeper than {MAX_DEPTH} levels"
    assert one_line(cli("pipeline.verify", str(run)), ExitCode.USAGE) == f"error: {named}"
    assert one_line(cli("pipeline.export", str(run), "--format", "speculators", "--out", str(tmp_path / "out")),
                    ExitCode.USAGE) == f"error: not a finished run: {named}"
    draft = make_draft(tmp_path / "d", llama, aux_ids=[0, 2, 4])
    assert one_line(cli("pipeline.doctor", "--draft", str(draft), "--serve", "sglang", "--no-load", "--run",
                        str(run)), ExitCode.USAGE) == f"error: --run: {named}"


def test_a_deeply_nested_start_record_is_a_verify_problem(run):
    (run / "run.json").write_text(DEEP)
    done = cli("pipeline.verify", str(run))
    assert done.returncode == ExitCode.REFUSED and "Traceback" not in output(done), output(done)[-3000:]
    assert f"run.json is not a run's start record: {run / 'run.json'} nests arrays or objects deeper than " \
           f"{MAX_DEPTH} levels" in done.stderr.splitlines()


def test_a_deeply_nested_shard_metadata_value_is_a_verify_problem(run):
    """A metadata value is JSON inside the safetensors header (a string there): parsed bounded, named, cut short."""
    path = run / "shards" / "shard-00000.safetensors"
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length])
    header["__metadata__"]["points"] = DEEP
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + length:])
    done = cli("pipeline.verify", str(run))
    assert done.returncode == ExitCode.REFUSED and "Traceback" not in output(done), output(done)[-3000:]
    named = [line for line in done.stderr.splitlines() if "metadata points" in line]
    assert len(named) == 1 and named[0].startswith("shard-00000: metadata points '[[[") and named[0].endswith(
        f"...' != manifest points {json.loads((run / 'manifest.json').read_text())['points']} (it nests arrays or "
        f"objects deeper than {MAX_DEPTH} levels)") and len(named[0]) < 400, named


def test_an_exports_own_files_are_read_bounded(run, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "export.json").write_text(DEEP)
    line = one_error(capsys, ExitCode.USAGE, export.main, str(run), "--format", "specforge", "--out", str(out))
    assert line == (f"error: --out {out} holds a finished export this job cannot read: {out / 'export.json'} nests "
                    f"arrays or objects deeper than {MAX_DEPTH} levels; choose another --out")
    (out / "export.json").unlink()
    (out / ".export-plan.json").write_text("[1, 2]")
    line = one_error(capsys, ExitCode.USAGE, export.main, str(run), "--format", "specforge", "--out", str(out))
    assert line == (f"error: --out {out} holds no export's start record: {out / '.export-plan.json'} holds a JSON "
                    "array, not an object; choose another --out")


def test_extract_names_a_start_record_it_cannot_read(finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    (out / "manifest.json").unlink()  # an unfinished run, whose start record was then damaged
    (out / "run.json").write_text(DEEP)
    done = extract(out, "gate.mode=off", "data.limit=6", "runner.max_tokens_per_shard=800")
    assert done.returncode == ExitCode.USAGE and "Traceback" not in output(done), output(done)[-3000:]
    lines = [line for line in output(done).splitlines() if "configuration error" in line]
    assert len(lines) == 1 and lines[0].endswith(
        f"configuration error: out_dir={str(out)!r} holds no run's start record: {out / 'run.json'} nests arrays or "
        f"objects deeper than {MAX_DEPTH} levels; choose another out_dir, or pass overwrite=true to replace that "
        "run"), output(done)[-3000:]


def test_extract_names_a_wrong_typed_field_of_the_models_config(models_root, tmp_path):
    model = tmp_path / "tiny-llama"
    shutil.copytree(models_root / "tiny-llama", model)
    edit_json(model / "config.json", lambda c: c.update(num_hidden_layers="six"))
    done = extract(tmp_path / "run", "model=tiny_llama", "model.build=null", f"model.path={model}", "gate.mode=off")
    assert done.returncode == ExitCode.USAGE and "Traceback" not in output(done), output(done)[-3000:]
    lines = [line for line in output(done).splitlines() if "configuration error" in line]
    assert len(lines) == 1 and lines[0].endswith(
        f"configuration error: model.path={str(model)!r}: {model / 'config.json'}: num_hidden_layers must be an "
        "integer, got 'six'"), output(done)[-3000:]
    assert not (tmp_path / "run").exists()


def test_a_deeply_nested_marker_is_no_marker_and_the_resume_redoes_its_shard(finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    (out / "manifest.json").unlink()  # unfinished: a rerun resumes it, trusting the markers it can read
    marker = out / "shards" / "shard-00000.done.json"
    assert marker.is_file()
    marker.write_text(DEEP)
    done = extract(out, "gate.mode=off", "data.limit=6", "runner.max_tokens_per_shard=800")
    assert done.returncode == ExitCode.OK and "Traceback" not in output(done), output(done)[-3000:]
    assert json.loads(marker.read_text())["files"]  # rewritten by the shard's redo
    assert cli("pipeline.verify", str(out)).returncode == ExitCode.OK
