"""A regeneration is days of a cluster's time: a kill -9 at any write step resumes to the same records, a second
regeneration on the same directory is refused while the first writes, a finished one is replaced only with
overwrite=true, a resume with other settings is refused naming them, and extract refuses prompt ids the template
no longer renders."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers import REPO
from tests.helpers.runs import env_with, extract, wait_for_step

pytestmark = pytest.mark.reliability

# Two parts of two conversations on the tiny Llama, greedy: the fastest regeneration with every kind of write step.
SMALL = ("model=tiny_llama", "data.limit=4", "runner.max_samples_per_shard=2", "sampling.max_tokens=4")
STEPS = ["write:regen.json", "rename:regen.json", "write:rejects.parquet", "rename:rejects.parquet",
         "write:part-00000.parquet", "rename:part-00000.parquet", "write:part-00000.done.json",
         "rename:part-00000.done.json", "write:part-00001.parquet", "rename:part-00001.parquet",
         "write:part-00001.done.json", "rename:part-00001.done.json", "write:manifest.json", "rename:manifest.json"]
# Before any part; a part in place without its marker; the second part's temp file; the manifest in place (the
# marker of part 0 is killed at in the settings and seeded-sampling tests below).
KILLED_AT = ["rename:regen.json", "rename:part-00000.parquet", "write:part-00001.parquet", "rename:manifest.json"]


def regen_cmd(out: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "pipeline.regenerate", f"out_dir={out}", f"hydra.run.dir={out}.logs", *SMALL,
            *overrides]


def regenerate(out: Path, *overrides: str, fault: str | None = None,
               trace: Path | None = None) -> subprocess.CompletedProcess:
    extra = {"PIPELINE_FAULT": fault} if fault else {}
    if trace is not None:
        extra["PIPELINE_FAULT_TRACE"] = str(trace)
    return subprocess.run(regen_cmd(out, *overrides), cwd=REPO, env=env_with(**extra), capture_output=True,
                          text=True, timeout=600)


def said(done: subprocess.CompletedProcess) -> str:
    return done.stdout + done.stderr  # Hydra's log lines go to stdout


def parts_of(root: Path) -> list[dict]:
    return json.loads((root / "manifest.json").read_text())["parts"]


@pytest.fixture(scope="module")
def clean(tmp_path_factory, models_root) -> tuple[Path, list[str]]:
    out = tmp_path_factory.mktemp("clean") / "regen"
    trace = out.parent / "steps.txt"
    done = regenerate(out, trace=trace)
    assert done.returncode == 0, done.stderr[-3000:]
    return out, [s for s in trace.read_text().split() if not s.startswith("start:")]


def test_the_step_list_covers_every_write_of_a_regeneration(clean):
    assert clean[1] == STEPS


@pytest.mark.parametrize("step", KILLED_AT)
def test_a_kill_at_any_step_resumes_to_the_same_records(clean, tmp_path, step):
    out = tmp_path / "regen"
    killed = regenerate(out, fault=f"kill@{step}")
    assert killed.returncode == -9, killed.stderr[-2000:]
    resumed = regenerate(out)
    if step == "rename:manifest.json":  # finished when it died: the same command refuses to redo it
        assert resumed.returncode == 2 and "holds a finished regeneration (manifest.json)" in said(resumed)
    else:
        assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert parts_of(out) == parts_of(clean[0])  # byte-identical parts (greedy)
    assert not list(out.rglob(".*.tmp")), "a resumed regeneration leaves no temp file behind"


def test_a_second_regeneration_on_the_same_directory_is_refused(tmp_path):
    out, trace, go = tmp_path / "regen", tmp_path / "steps.txt", tmp_path / "go"
    first = subprocess.Popen(regen_cmd(out), cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=env_with(PIPELINE_FAULT=f"pause={go}@write:part-00000.parquet",
                                          PIPELINE_FAULT_TRACE=str(trace)))
    try:
        wait_for_step(trace, "write:part-00000.parquet", first, timeout=300)
        second = regenerate(out)
        assert second.returncode == 2
        assert "is in use by pid" in said(second) and "another regenerate is writing it" in said(second)
    finally:
        go.touch()
        first.wait(timeout=300)
    assert first.returncode == 0, first.stderr.read()[-2000:] if first.stderr else ""
    assert (out / "manifest.json").is_file()


def test_a_finished_regeneration_is_replaced_only_with_overwrite(clean, tmp_path):
    out = tmp_path / "regen"
    shutil.copytree(clean[0], out)
    again = regenerate(out)
    assert again.returncode == 2 and "overwrite=true" in said(again)
    assert regenerate(out, "overwrite=true").returncode == 0
    assert parts_of(out) == parts_of(clean[0])


@pytest.mark.parametrize("user_entry", ["records/notes.txt", "records/sub/"])
def test_overwrite_never_removes_a_users_entry_inside_the_records(clean, tmp_path, user_entry):
    out = tmp_path / "regen"
    shutil.copytree(clean[0], out)
    target = out / user_entry
    target.mkdir() if user_entry.endswith("/") else target.write_text("the user's own file")
    refused = regenerate(out, "overwrite=true")
    assert refused.returncode == 2, said(refused)[-3000:]
    assert f"files a regeneration does not write ({user_entry})" in said(refused)
    assert target.exists() and parts_of(out) == parts_of(clean[0]) and (out / "manifest.json").is_file()
    broken = subprocess.run([sys.executable, "-m", "pipeline.verify", str(out)], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert broken.returncode == 3 and f"{user_entry}: not a file a regeneration writes" in broken.stderr


@pytest.mark.parametrize("override, message", [
    ("gate.mode=off", "gate is extract's, not regenerate's"),
    ("sampling.n=2", "n > 1 needs a temperature > 0"),
    ("sampling.truncated=cut", "sampling.truncated='cut'"),
    ("capture.points=[1]", "capture"),
    # #35 item 10: out of range values were accepted (inf wrote random answers and a manifest holding Infinity; an
    # id past int64 was an overflow traceback after regen.json; -1 or an id past the vocabulary passed silently)
    ("sampling.temperature=inf", "sampling.temperature=inf: must be a finite number >= 0"),
    ("sampling.top_p=nan", "sampling.top_p=nan: must be within (0, 1]"),
    ("sampling.stop_token_ids=[-1]", "sampling.stop_token_ids=[-1]: -1 is not a token id"),
    ("sampling.stop_token_ids=[99999999999999999999]", "99999999999999999999 is not a token id"),
    ("sampling.stop_token_ids=[99999]", "99999 is outside the tokenizer's"),
])
def test_bad_settings_are_one_line_before_any_model_loads(tmp_path, override, message):
    done = regenerate(tmp_path / "regen", override)
    assert done.returncode == 2 and message in said(done), said(done)[-2000:]
    assert not (tmp_path / "regen").exists()


def test_data_path_a_regeneration_and_out_dir_inside_a_run_are_refused(clean, tmp_path):
    again = regenerate(tmp_path / "regen", f"data.path={clean[0]}")
    assert again.returncode == 2 and "is a regeneration directory" in said(again)
    finished = shutil.copytree(clean[0], tmp_path / "finished")  # the refused run's Hydra logs go inside it
    inside = regenerate(finished / "sub")
    assert inside.returncode == 2 and "inside the regeneration directory" in said(inside)
    assert not (finished / "sub").exists()


def test_extract_rejects_prompt_ids_the_template_no_longer_renders(clean, models_root):
    from pipeline.data.regeneration import read_regenerated
    from pipeline.data.remote_code import load_tokenizer

    tokenizer = load_tokenizer(models_root / "tiny-llama", False)
    kept = read_regenerated(clean[0], tokenizer, max_length=2048, length_policy="truncate", limit=None,
                            train_think_tags=False)
    assert len(kept.samples) == 4 and not kept.rejects
    tokenizer.chat_template = tokenizer.chat_template.replace("<|im_middle|>", "<|im_middle|> ")
    drifted = read_regenerated(clean[0], tokenizer, max_length=2048, length_policy="truncate", limit=None,
                               train_think_tags=False)
    assert not drifted.samples and {r.reason for r in drifted.rejects} == {"template_drift"}
    assert "differs from the tokenizer's rendering" in drifted.rejects[0].detail


def test_ray_replicas_regenerate_the_local_records(clean, tmp_path):
    """Two replicas on a loopback Ray cluster, units handed out as they free up: the same parts, in input order."""
    out = tmp_path / "regen"
    done = regenerate(out, "runner=ray", "runner.num_replicas=2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert parts_of(out) == parts_of(clean[0])
    assert subprocess.run([sys.executable, "-m", "pipeline.verify", str(out)], cwd=REPO, capture_output=True,
                          timeout=120).returncode == 0


def test_seeded_sampling_resumes_to_the_same_records_and_n_samples_differ(tmp_path):
    """HF samples one request at a time from a generator seeded per turn: a killed seeded regeneration resumes to
    the uninterrupted one's bytes (a resume with other settings is refused, naming them), and the n samples of one
    prompt are n different answers."""
    seeded = ("sampling.temperature=1.0", "sampling.top_p=0.9", "sampling.n=2", "sampling.seed=7")
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert regenerate(whole, *seeded).returncode == 0
    assert regenerate(cut, *seeded, fault="kill@rename:part-00000.done.json").returncode == -9
    other = regenerate(cut, *seeded, "sampling.max_tokens=5")  # a resume with other settings: refused, named
    assert other.returncode == 2
    assert "unfinished regeneration with a different config (sampling.max_tokens: 4 then, 5 now)" in said(other)
    assert regenerate(cut, *seeded).returncode == 0  # the same command finishes it
    assert parts_of(cut) == parts_of(whole)
    import pyarrow.parquet as pq

    rows = [r for p in parts_of(whole) for r in pq.read_table(whole / p["file"]).to_pylist()]
    assert [(r["row"], r["sample"]) for r in rows] == [(row, s) for row in range(4) for s in range(2)]
    firsts = {}
    for r in rows:
        firsts.setdefault(r["row"], []).append(r["turns"][0]["output_ids"])
    assert all(a != b for a, b in firsts.values())
    assert len({r["turns"][0]["seed"] for r in rows}) == len(rows)


def test_verify_names_a_changed_part_and_a_foreign_file(clean, tmp_path):
    out = tmp_path / "regen"
    shutil.copytree(clean[0], out)

    def verify() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pipeline.verify", str(out)], cwd=REPO, capture_output=True,
                              text=True, timeout=120)

    sound = verify()
    assert sound.returncode == 0 and "regeneration of 4 records" in sound.stdout
    keyed = subprocess.run([sys.executable, "-m", "pipeline.verify", str(out), "--key", "/dev/null"], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    assert keyed.returncode == 2 and "carries no signature" in keyed.stderr  # never "sound" for a proof not made
    part = out / "records" / "part-00001.parquet"
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF
    part.write_bytes(bytes(data))
    (out / "notes.txt").write_text("mine")
    broken = verify()
    assert broken.returncode == 3
    assert "records/part-00001.parquet: sha256 differs from the manifest's" in broken.stderr
    assert "notes.txt: not a file a regeneration writes" in broken.stderr


def test_verify_compares_the_conversations_and_end_reasons_with_the_parts(clean, tmp_path):
    """#35 item 7: the last part gone (its files and its manifest entry), the turn and token totals lowered to match
    what is left: the manifest still claims four conversations and their end reasons, which the parts do not hold."""
    out = tmp_path / "regen"
    shutil.copytree(clean[0], out)
    manifest = json.loads((out / "manifest.json").read_text())
    last = manifest["parts"].pop()
    for name in (last["file"], last["file"].replace(".parquet", ".done.json")):
        (out / name).unlink()
    rows = pq.read_table(out / manifest["parts"][0]["file"]).to_pylist()
    turns = [t for r in rows for t in r["turns"]]
    manifest.update(num_turns=len(turns), generated_tokens=sum(len(t["output_ids"]) for t in turns),
                    prompt_tokens=sum(len(t["prompt_ids"]) for t in turns))
    manifest["truncated"]["kept"] = sum(t["finish_reason"] == "length" for t in turns)
    (out / "manifest.json").write_text(json.dumps(manifest))
    broken = subprocess.run([sys.executable, "-m", "pipeline.verify", str(out)], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert broken.returncode == 3, broken.stdout + broken.stderr
    assert "manifest num_conversations=4, the parts hold 2" in broken.stderr, broken.stderr
    assert "manifest end_reasons=" in broken.stderr, broken.stderr


def test_a_regeneration_without_one_conversation_exits_2_unfinished(tmp_path):
    """#35 item 15: every record's first prompt over data.max_length (each a part's reject): exit 2 in one line naming
    the reasons and where they are, no manifest (extract would refuse it); the same rerun says the same."""
    out = tmp_path / "regen"
    for _ in range(2):
        done = regenerate(out, "data.max_length=16")
        assert done.returncode == 2, said(done)[-2000:]
        errors = [line for line in said(done).splitlines() if "ERROR" in line]
        assert len(errors) == 1 and "4 rejected (too_long: 4)" in errors[0] and "rejects.parquet" in errors[0], errors
        assert "Traceback" not in said(done) and not (out / "manifest.json").exists()


def test_conversations_rejected_by_the_stage_leave_a_sound_regeneration(tmp_path):
    """A record whose first prompt is over data.max_length is a part's reject with its end reason: the others are
    regenerated and verify counts both (no false problem from the totals checks)."""
    out = tmp_path / "regen"
    done = regenerate(out, "data.limit=6", "data.max_length=48")
    assert done.returncode == 0, said(done)[-2000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["end_reasons"].get("too_long", 0) >= 1 and manifest["num_conversations"] >= 1, manifest
    sound = subprocess.run([sys.executable, "-m", "pipeline.verify", str(out)], cwd=REPO, capture_output=True,
                           text=True, timeout=120)
    assert sound.returncode == 0 and sound.stdout.startswith("sound:"), sound.stdout + sound.stderr


def _forge_ids(root: Path, part_index: int, ids: list[int]) -> None:
    """Replace the first turn's generated ids of part `part_index` with `ids`, its checksums recomputed everywhere
    (part entry, unit marker): what a forger or a broken engine leaves."""
    import hashlib

    manifest = json.loads((root / "manifest.json").read_text())
    entry = manifest["parts"][part_index]
    path = root / entry["file"]
    table = pq.read_table(path)
    rows = table.to_pylist()
    rows[0]["turns"][0]["output_ids"] = ids
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)
    digest, size = hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_size
    entry.update(sha256=digest, bytes=size)
    marker_path = root / entry["file"].replace(".parquet", ".done.json")
    marker = json.loads(marker_path.read_text())
    marker["files"][entry["file"]] = {"sha256": digest, "bytes": size}
    marker_path.write_text(json.dumps(marker))
    (root / "manifest.json").write_text(json.dumps(manifest))


def test_generated_ids_outside_the_vocabulary_are_named_by_verify_and_rejected_by_extract(clean, tmp_path):
    """#35 item 6: ids 99999 and -1 in two conversations, checksums recomputed: verify names both (exit 3); extract
    rejects those two conversations (id_out_of_vocabulary) and captures the others, where it died with an IndexError
    traceback on every rerun."""
    out = tmp_path / "regen"
    shutil.copytree(clean[0], out)
    _forge_ids(out, 0, [99999, 5])
    _forge_ids(out, 1, [7, -1])
    broken = subprocess.run([sys.executable, "-m", "pipeline.verify", str(out)], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert broken.returncode == 3, broken.stdout + broken.stderr
    assert "output_ids holds 99999, no token id of the target" in broken.stderr, broken.stderr
    assert "output_ids holds -1, no token id of the target" in broken.stderr, broken.stderr
    run = tmp_path / "run"
    done = extract(run, "model=tiny_llama", f"data.path={out}", "gate.mode=off")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["num_samples"] == 2 and manifest["rejects"]["by_reason"] == {"id_out_of_vocabulary": 2}, manifest


@pytest.mark.parametrize("text, named", [
    ("{not json", "generation_config.json"),
    ("[1, 2]", "holds a JSON array, not an object"),
    ('{"eos_token_id": "abc"}', "eos_token_id"),
    ('{"eos_token_id": [2, -1]}', "eos_token_id must hold token ids >= 0"),
])
def test_a_malformed_generation_config_is_one_line_naming_it(tmp_path, models_root, tiny_model, text, named):
    """#35 item 11: the checkpoint's generation_config.json not JSON, not an object, or its eos ids not ids: exit 2
    in one line naming the file (not data.path), no traceback, before any engine starts."""
    tiny_model("tiny-llama")
    model = tmp_path / "model"
    shutil.copytree(models_root / "tiny-llama", model)
    (model / "generation_config.json").write_text(text)
    out = tmp_path / "regen"
    done = subprocess.run([sys.executable, "-m", "pipeline.regenerate", f"out_dir={out}", f"hydra.run.dir={out}.logs",
                           f"model.path={model}", "data.limit=2", "sampling.max_tokens=4"], cwd=REPO,
                          env=env_with(), capture_output=True, text=True, timeout=300)
    lines = said(done).strip().splitlines()
    assert done.returncode == 2, said(done)[-2000:]
    assert "Traceback" not in said(done) and "data.path" not in lines[-1], lines[-1]
    assert f"model.path={str(model)!r}" in lines[-1] and named in lines[-1], lines[-1]
    assert not (out / "regen.json").exists()


@pytest.mark.parametrize("edit, field", [
    (lambda m: m.update(parts="x"), "parts must be an array, got 'x'"),
    (lambda m: m["provenance"].pop("engine"), "provenance.engine is missing (it must be an object)"),
    (lambda m: m["provenance"]["sampling"]["values"].update(max_tokens="abc"),
     "provenance.sampling.values.max_tokens must be an integer, got 'abc'"),
])
def test_a_wrong_typed_regeneration_manifest_field_is_named_with_exit_2(clean, tmp_path, edit, field):
    """#35 item 9: verify and extract name the field, exit 2, as they do for a run's manifest (it was a traceback)."""
    out = tmp_path / "regen"
    shutil.copytree(clean[0], out)
    manifest = json.loads((out / "manifest.json").read_text())
    edit(manifest)
    (out / "manifest.json").write_text(json.dumps(manifest))
    checked = subprocess.run([sys.executable, "-m", "pipeline.verify", str(out)], cwd=REPO, capture_output=True,
                             text=True, timeout=120)
    assert checked.returncode == 2 and "Traceback" not in checked.stderr, checked.stderr
    assert checked.stderr.strip().splitlines()[-1] == f"error: {out / 'manifest.json'}: {field}", checked.stderr
    done = extract(tmp_path / "run", "model=tiny_llama", f"data.path={out}")
    assert done.returncode == 2 and "Traceback" not in said(done), said(done)[-2000:]
    assert f"{out / 'manifest.json'}: {field}" in said(done), said(done)[-2000:]


def test_a_deeply_nested_string_in_a_part_is_that_conversations_reject(clean, tmp_path):
    """#35 item 9: a turn's `messages` string nesting 5000 deep (checksums recomputed): extract rejects that
    conversation (malformed_json) and captures the others, where it exited 1 "rerun to resume" every time."""
    import hashlib

    out = tmp_path / "regen"
    shutil.copytree(clean[0], out)
    manifest = json.loads((out / "manifest.json").read_text())
    entry = manifest["parts"][0]
    path = out / entry["file"]
    table = pq.read_table(path)
    rows = table.to_pylist()
    rows[0]["turns"][0]["messages"] = "[" * 5000 + "]" * 5000
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)
    entry.update(sha256=hashlib.sha256(path.read_bytes()).hexdigest(), bytes=path.stat().st_size)
    (out / "manifest.json").write_text(json.dumps(manifest))
    run = tmp_path / "run"
    done = extract(run, "model=tiny_llama", f"data.path={out}", "gate.mode=off")
    assert done.returncode == 0, said(done)[-3000:]
    captured = json.loads((run / "manifest.json").read_text())
    assert captured["num_samples"] == 3 and captured["rejects"]["by_reason"] == {"malformed_json": 1}, captured


def test_a_manifest_naming_a_part_outside_the_directory_is_refused_unread(clean, tmp_path):
    """#35 item 3: a regeneration manifest naming /dev/zero as its part made extract read until memory ran out
    (verify refused it, extract did not check); now both refuse the field, exit 2, under a 6 GiB address-space cap."""
    import resource

    out = tmp_path / "regen"
    shutil.copytree(clean[0], out)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["parts"][0]["file"] = "/dev/zero"
    (out / "manifest.json").write_text(json.dumps(manifest))
    capped = lambda: resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))  # noqa: E731
    for cmd in ([sys.executable, "-m", "pipeline.verify", str(out)],
                [sys.executable, "-m", "pipeline.extract", f"out_dir={tmp_path / 'run'}", "model=tiny_llama",
                 f"data.path={out}", f"hydra.run.dir={tmp_path / 'logs'}"]):
        done = subprocess.run(cmd, cwd=REPO, env=env_with(), capture_output=True, text=True, timeout=300,
                              preexec_fn=capped)
        assert done.returncode == 2 and "Traceback" not in said(done), said(done)[-2000:]
        assert "parts[0].file must be 'records/part-00000.parquet', got '/dev/zero'" in said(done), said(done)[-2000:]


def test_a_long_record_says_where_it_is_while_its_unit_runs(tmp_path, models_root):
    """#35: a record of many turns ran minutes with no line (a unit logs when it ends); now the unit says, at least
    every PIPELINE_PROGRESS_SECONDS, how many turns are done and which conversation is furthest."""
    record = {"messages": [m for i in range(6) for m in ({"role": "user", "content": f"question {i}"},
                                                         {"role": "assistant", "content": f"answer {i}"})]}
    data = tmp_path / "long.jsonl"
    data.write_text(json.dumps(record) + "\n")
    # Every turn ends within a few tokens: any id of the tokenizer stops it, and a near-uniform draw (the random
    # model's greedy answers repeat one id above the tokenizer's range) gives one of them at 3 tokens in 4.
    every_id = "[" + ",".join(map(str, range(3047))) + "]"
    command = regen_cmd(tmp_path / "regen", f"data.path={data}", f"sampling.stop_token_ids={every_id}",
                        "sampling.max_tokens=64", "sampling.temperature=1000")
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600,
                          env=env_with(PIPELINE_PROGRESS_SECONDS="0"))
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in said(done).splitlines() if "regenerating 1 conversation(s)" in line]
    assert len(lines) == 5, said(done)[-3000:]  # before each round after the first: six turns, six rounds
    assert "5 round(s) of turns, 1 still going, 5 turns" in lines[-1] and "is at turn 5" in lines[-1]
