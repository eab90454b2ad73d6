"""`python -m pipeline.extract` and `python -m pipeline.verify` as a user runs them, on the tiny INT4 target."""
from __future__ import annotations

import json
import subprocess

import pytest
import torch
from safetensors import safe_open

from pipeline.shards.reader import RunReader
from tests.helpers.cli import cli

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SMALL = ["data.limit=24", "runner.max_tokens_per_shard=1500", "runner.max_samples_per_shard=8"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, models_root):
    out = tmp_path_factory.mktemp("e2e") / "run"
    proc = cli("pipeline.extract", f"out_dir={out}", *SMALL, f"hydra.run.dir={out.parent / 'logs'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


def test_extract_prints_where_what_and_which_points(finished_run):
    out, proc = finished_run
    assert f"run directory: {out.resolve()}" in proc.stdout
    assert "wrote 24 samples" in proc.stdout
    assert "capture points: b0, b1, b4, b7, final_norm" in proc.stdout


def test_the_wrappers_unused_weights_are_one_line_not_a_load_report(finished_run):
    """Each HF load of the default (the gate's reference, then the primary) says once what it skipped and why."""
    _, proc = finished_run
    console = proc.stdout + proc.stderr
    assert "UNEXPECTED" not in console and "LOAD REPORT" not in console, console[-3000:]
    assert console.count("weights of the kimi_k25 checkpoint outside its text model") == 2, console[-3000:]


def test_verify_accepts_the_run(finished_run):
    out, _ = finished_run
    proc = cli("pipeline.verify", str(out))
    assert proc.returncode == 0, proc.stderr


def test_manifest_and_shards_carry_provenance(finished_run):
    out, _ = finished_run
    manifest = json.loads((out / "manifest.json").read_text())
    prov = manifest["provenance"]
    assert len(manifest["shards"]) >= 3 and manifest["num_samples"] == 24
    assert prov["engine"]["framework"] == "transformers"
    assert prov["engine"]["quantization"]["method"] == "compressed-tensors"
    assert prov["model"]["quantization_config"]["format"] == "pack-quantized"
    assert [s["point"] for s in prov["capture"]["sources"]] == manifest["points"]
    assert prov["model"]["weights"]["mode"] == "full" and prov["model"]["chat_template_sha256"]
    assert "git_commit" in prov["code"] and prov["config"]["engine"]["name"] == "hf"
    with safe_open(str(out / "shards" / (manifest["shards"][0]["name"] + ".safetensors")), "pt") as f:
        meta = f.metadata()
    assert meta["provenance_digest"] == manifest["provenance_digest"]
    assert json.loads(meta["engine"])["framework"] == "transformers"


def test_verify_names_shards_whose_provenance_is_not_the_runs(tmp_path, finished_run):
    """As if a shard had been written by another engine version than the one the manifest records."""
    out, _ = finished_run
    run = tmp_path / "run"
    subprocess.run(["cp", "-a", str(out), str(run)], check=True)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["provenance"]["engine"]["framework_version"] = "0.0-other"
    manifest["provenance"]["diff"]["status"] = "pass"  # the gate's figures are not compared: a resume re-runs it
    (run / "manifest.json").write_text(json.dumps(manifest))
    proc = cli("pipeline.verify", str(run))
    assert proc.returncode != 0
    named = [line for line in proc.stdout.splitlines() + proc.stderr.splitlines() if "metadata engine" in line]
    assert len(named) == len(manifest["shards"]), proc.stdout + proc.stderr
    assert "0.0-other" in named[0] and "the manifest's provenance" in named[0]
    assert not any("metadata diff" in line for line in proc.stdout.splitlines() + proc.stderr.splitlines())


def test_embedding_point_is_the_checkpoint_table_row(finished_run, tiny_model):
    out, _ = finished_run
    from safetensors.torch import load_file

    weights = {}
    for f in tiny_model("tiny-kimi-int4").glob("*.safetensors"):
        weights.update(load_file(f))
    table = weights["model.embed_tokens.weight"]
    reader = RunReader(out)
    sample = reader[reader.sample_ids[5]]
    assert torch.equal(sample["hidden_states"][:, 0], table[sample["input_ids"]])


def test_a_finished_run_is_never_overwritten_silently(finished_run):
    out, _ = finished_run
    before = (out / "manifest.json").read_bytes()
    proc = cli("pipeline.extract", f"out_dir={out}", *SMALL, f"hydra.run.dir={out.parent / 'logs'}")
    assert proc.returncode != 0 and "holds a finished run" in proc.stderr + proc.stdout
    assert (out / "manifest.json").read_bytes() == before


def test_resume_redoes_only_unfinished_shards(tmp_path, finished_run):
    out, _ = finished_run
    run = tmp_path / "run"
    subprocess.run(["cp", "-a", str(out), str(run)], check=True)
    manifest = json.loads((run / "manifest.json").read_text())
    (run / "manifest.json").unlink()
    (run / "shards" / "shard-00001.done.json").unlink()  # as if killed while writing shard 1
    (run / "shards" / "shard-00001.safetensors").write_bytes(b"torn")
    kept = run / "shards" / "shard-00000.safetensors"
    mtime = kept.stat().st_mtime_ns
    proc = cli("pipeline.extract", f"out_dir={run}", *SMALL, f"hydra.run.dir={tmp_path / 'logs'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"({len(manifest['shards']) - 1} finished earlier)" in proc.stdout
    assert kept.stat().st_mtime_ns == mtime
    resumed = json.loads((run / "manifest.json").read_text())
    assert [s["files"] for s in resumed["shards"]] == [s["files"] for s in manifest["shards"]]  # same bytes
    assert cli("pipeline.verify", str(run)).returncode == 0


def test_resume_refuses_different_settings(tmp_path, finished_run):
    out, _ = finished_run
    run = tmp_path / "run"
    subprocess.run(["cp", "-a", str(out), str(run)], check=True)
    (run / "manifest.json").unlink()
    proc = cli("pipeline.extract", f"out_dir={run}", *SMALL, "engine.batch_size=3",
               f"hydra.run.dir={tmp_path / 'logs'}")
    assert proc.returncode != 0 and "unfinished run with a different config" in proc.stderr + proc.stdout


def test_resume_under_other_code_names_the_commit_that_finishes_it(tmp_path, finished_run):
    """An unfinished run started by another version of the pipeline (its run.json as that version wrote it) is not
    resumed by this one (every shard of a run carries one code version); the error says which commit finishes it."""
    out, _ = finished_run
    run = tmp_path / "run"
    subprocess.run(["cp", "-a", str(out), str(run)], check=True)
    (run / "manifest.json").unlink()
    record = json.loads((run / "run.json").read_text())
    record["code"] = {**record["code"], "git_commit": "0123456789abcdef0123456789abcdef01234567", "dirty": True}
    (run / "run.json").write_text(json.dumps(record))
    proc = cli("pipeline.extract", f"out_dir={run}", *SMALL, f"hydra.run.dir={tmp_path / 'logs'}")
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2, said[-3000:]
    assert "unfinished run with a different code (" in said
    assert "git_commit: '0123456789abcdef0123456789abcdef01234567' then" in said
    assert ("resume it with the same settings and the code it started with (git commit "
            "0123456789abcdef0123456789abcdef01234567 plus the uncommitted changes it ran with)") in said


@pytest.mark.parametrize("override, message", [
    ("engine=nosuch", "engine"),
    ("engine.name=tensorrt", "engine='tensorrt' is unknown"),
    ("capture.points=[0,9]", "out of range: this model has 8 decoder layers"),
    ("data.path=/no/such.jsonl", "data.path='/no/such.jsonl'"),
    ("model=kimi_k25", "model.path"),
])
def test_bad_input_fails_before_anything_is_written(tmp_path, override, message):
    out = tmp_path / "run"
    proc = cli("pipeline.extract", f"out_dir={out}", override, f"hydra.run.dir={tmp_path / 'logs'}")
    assert proc.returncode != 0
    assert message in proc.stderr + proc.stdout
    assert not out.exists()


@pytest.mark.parametrize("runner", ["local", "ray"])
def test_an_engine_that_cannot_start_is_one_clear_line_and_nothing_is_written(tmp_path, runner):
    out = tmp_path / "run"
    proc = cli("pipeline.extract", f"out_dir={out}", f"runner={runner}", "gate.mode=off", *SMALL,
               "engine.options.attn_implementation=flash_attention_9", f"hydra.run.dir={tmp_path / 'logs'}")
    output = proc.stderr + proc.stdout
    assert proc.returncode == 2, output[-3000:]
    errors = [line for line in output.splitlines() if "[pipeline.extract][ERROR]" in line]
    assert len(errors) == 1 and "engine=hf did not start" in errors[0] and "flash_attention_9" in errors[0], output
    assert "Traceback" not in output and "nothing was written" in errors[0]
    assert not (out / "manifest.json").exists() and not list(out.glob("shards/*"))
