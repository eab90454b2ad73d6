"""#36 item 5: a capacity plan before any engine starts. A run its out_dir's file system cannot hold is refused in one
line with both figures (exit 2) before an engine or a weight is touched; check_space=false lets it run; a resume counts
only what is left; `plan=true` prints tokens, bytes, free space, the engines with TP sizes and memory per GPU,
estimated from config.json alone when no weight file is there (the real Kimi-K2.5's sizes)."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from pipeline.models.memory import weight_size
from tests.helpers.runs import SMALL, extract, output

pytestmark = pytest.mark.reliability
KIMI_TEXT = {"hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048, "vocab_size": 163840,
             "n_routed_experts": 384, "num_experts_per_tok": 8, "num_attention_heads": 64, "num_key_value_heads": 64,
             "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
             "v_head_dim": 128, "qk_head_dim": 192, "head_dim": 64, "num_hidden_layers": 61}  # ../shared/KIMI_K25.md


def _plan(done) -> dict[str, str]:
    text = output(done)
    figures = re.search(r"(\d+) shard\(s\), (\d+) tokens left to write", text)
    per_token = re.search(r"= (\d+) bytes per token", text)
    assert figures and per_token, text[-3000:]
    return {"shards_left": int(figures[1]), "tokens_left": int(figures[2]), "per_token": int(per_token[1])}


def test_a_run_that_cannot_fit_is_refused_before_any_engine_starts(small_fs, models_root):
    out = small_fs / "run"
    done = extract(out, "gate.mode=off", "data.limit=40")
    assert done.returncode == 2, output(done)[-3000:]
    [line] = [l for l in output(done).splitlines() if "free" in l and "needs about" in l]
    assert re.search(r"needs about [\d.]+ MiB .* has [\d.]+ MiB free", line) and "check_space=false" in line
    assert "Traceback" not in output(done) and "Loading weights" not in output(done)  # no model was loaded
    assert not out.exists()  # nothing written, not even the directory


def test_check_space_false_lets_it_run_into_the_full_disk(small_fs, models_root):
    out = small_fs / "run"
    done = extract(out, "gate.mode=off", "data.limit=40", "check_space=false")
    assert done.returncode == 1, output(done)[-3000:]  # it ran: the disk filled, one line, rerun to resume
    assert "No space left on device" in output(done) and "Traceback" not in output(done)


def test_a_resume_counts_only_what_is_left(tmp_path, models_root):
    out = tmp_path / "run"
    killed = extract(out, *SMALL, fault="kill@unlink:shard-00001.done.json")  # shard 0 finished, shard 1 not
    assert killed.returncode == -9
    fresh, resumed = extract(tmp_path / "other", *SMALL, "plan=true"), extract(out, *SMALL, "plan=true")
    assert fresh.returncode == resumed.returncode == 0, output(resumed)[-3000:]
    whole, left = _plan(fresh), _plan(resumed)
    assert (whole["shards_left"], left["shards_left"]) == (2, 1) and 0 < left["tokens_left"] < whole["tokens_left"]
    assert not (tmp_path / "other").exists()  # a plan writes nothing
    assert "nothing was started and no weight was read" in output(resumed)


def test_the_plan_is_close_to_what_the_run_writes(tmp_path, models_root):
    out = tmp_path / "run"
    planned = extract(out, "gate.mode=off", "model=tiny_llama", "plan=true")
    done = extract(out, "gate.mode=off", "model=tiny_llama")
    assert done.returncode == 0, output(done)[-3000:]
    on_disk = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    estimate = re.search(r"about ([\d.]+) MiB on disk in all", output(planned))
    assert estimate and 1.0 <= float(estimate[1]) * 2**20 / on_disk <= 1.05, (estimate, on_disk)  # never short


@pytest.fixture(scope="module")
def kimi_config_only(tmp_path_factory, models_root) -> Path:
    """Kimi-K2.5's own config.json (its published sizes) with the tiny K2.5's tokenizer files, and no weight file."""
    tiny = models_root / "tiny-k25-int4"
    out = tmp_path_factory.mktemp("kimi") / "Kimi-K2.5"
    out.mkdir()
    for f in tiny.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, out / f.name)
    config = json.loads((tiny / "config.json").read_text())
    config["text_config"].update(KIMI_TEXT)
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.mark.parametrize("storage, per_token", [("null", 71680), ("float8_e4m3fn", 35840 + 5 * 4)])
def test_the_kimi_recipe_plan_from_config_json_alone(kimi_config_only, tmp_path, storage, per_token):
    done = extract(tmp_path / "run", "+exp=kimi", f"model.path={kimi_config_only}", f"runner.storage_dtype={storage}",
                   "plan=true")
    assert done.returncode == 0, output(done)[-3000:]
    assert _plan(done)["per_token"] == per_token
    engines = [l for l in output(done).splitlines() if l.startswith("engine ")]
    assert [l.split(" (")[0] for l in engines] == ["engine sglang@bfloat16", "engine vllm@bfloat16"]
    for line in engines:  # ~554 GB of INT4 experts and bf16 rest, over 8 GPUs
        assert "TP 8: weights 553.4 GiB (estimated from config.json" in line and "69.2 GiB per GPU" in line
    assert not list(kimi_config_only.glob("*.safetensors"))


@pytest.mark.parametrize("name", ["tiny-kimi-int4", "tiny-k25-int4", "tiny-llama", "smollm2-135m-instruct",
                                  "smollm2-135m-instruct-w4a16"])
def test_the_estimate_from_config_json_matches_the_weight_files(models_root, tmp_path, name):
    shutil.copy(models_root / name / "config.json", tmp_path / "config.json")
    estimate, files = weight_size(tmp_path), weight_size(models_root / name)
    assert "estimated from config.json" in estimate.how and "weight file" in files.how
    assert 0.99 <= estimate.bytes / files.bytes <= 1.0, (estimate, files)  # the vision tower is not estimated
