"""#36 item 5 for regenerate: the parts' bound (every turn's prompt and answer at data.max_length) against out_dir's
free space, before any engine starts. A regeneration that may not fit is refused in one line with both figures
(exit 2), nothing written; check_space=false lets it run, and what it writes is within the bound; a resume counts only
the parts without their marker."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.data import regeneration as rd
from pipeline.regen.conversation import Conversation
from pipeline.regen.room import bound_bytes, check_room, turns_of
from tests.helpers import REPO
from tests.helpers.runs import env_with, output

pytestmark = pytest.mark.reliability
# 40 bundled conversations (41 turns) at data.max_length=8192: a bound of 6.3 MiB, over the 4 MiB file system; they
# write about 50 KB
BIG = ("model=tiny_llama", "data.limit=40", "data.max_length=8192", "sampling.max_tokens=4")


def _regenerate(out: Path, logs: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline.regenerate", f"out_dir={out}", f"hydra.run.dir={logs}",
                           *overrides], cwd=REPO, env=env_with(), capture_output=True, text=True, timeout=600)


def test_a_regeneration_that_may_not_fit_is_refused_before_any_engine_starts(small_fs, tmp_path):
    out = small_fs / "answers"
    done = _regenerate(out, tmp_path / "logs", *BIG)
    assert done.returncode == 2, output(done)[-3000:]
    [line] = [l for l in output(done).splitlines() if "may not fit" in l]
    assert re.search(r"1 of 1 part\(s\) left to write, at most 6.3 MiB .* has [\d.]+ MiB free", line), line
    assert "check_space=false" in line and "data.max_length=8192" in line
    assert "Traceback" not in output(done) and "Loading weights" not in output(done)
    assert not out.exists()


def test_check_space_false_lets_it_run_and_it_writes_within_the_bound(small_fs, tmp_path):
    out = small_fs / "answers"
    done = _regenerate(out, tmp_path / "logs", *BIG, "check_space=false")
    assert done.returncode == 0, output(done)[-3000:]
    written = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    bound = re.search(r"at most ([\d.]+) MiB", output(done))
    assert bound is None  # not checked, not said
    assert 0 < written < 4 << 20 and rd.read_manifest(out)["num_conversations"] == 40


def _conversation(i: int, roles: list[str]) -> Conversation:
    return Conversation(conversation_id=f"c{i}", record_id=f"r{i}", source="s", row=i, sample=0, seed=i,
                        messages=tuple({"role": r, "content": "x"} for r in roles), tools=None)


def test_the_bound_counts_each_turn_and_a_resume_only_the_parts_left(tmp_path):
    assert turns_of(_conversation(0, ["user"])) == 1
    assert turns_of(_conversation(0, ["system", "user", "assistant", "user", "assistant"])) == 2
    assert turns_of(_conversation(0, ["user", "assistant", "user"])) == 2
    units = [[_conversation(0, ["user"]), _conversation(1, ["user", "assistant", "user"])], [_conversation(2, ["user"])]]
    assert bound_bytes(units, 100) == 4 * (100 * 16 + 512) + 2 * (64 << 10)
    out = tmp_path / "answers"
    assert "2 of 2 part(s) left to write" in check_room(out, units, max_length=100, overwrite=False)
    marker = rd.part_paths(out, 0)["marker"]
    marker.parent.mkdir(parents=True)
    marker.write_text("{}")
    assert "1 of 2 part(s) left to write" in check_room(out, units, max_length=100, overwrite=False)
    assert "2 of 2 part(s) left to write" in check_room(out, units, max_length=100, overwrite=True)


def test_a_replacement_counts_the_folder_it_frees_as_free(small_fs):
    """`free_bytes(out, freed=folder)`: what the replacement removes first is free to it (extract's shards/, a
    regeneration's records/); nothing else under out_dir is."""
    from pipeline.shards.capacity import free_bytes

    (small_fs / "records").mkdir()
    (small_fs / "records" / "part-00000.parquet").write_bytes(b"x" * (1 << 20))
    (small_fs / "kept.bin").write_bytes(b"y" * (1 << 20))
    free = free_bytes(small_fs)
    assert free_bytes(small_fs, freed=small_fs / "records") == free + (1 << 20)
    assert free_bytes(small_fs, freed=small_fs / "no-such-folder") == free
