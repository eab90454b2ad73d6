"""One bad record never stops a data set (issue 24, cases 2-4): a 200 MB record under a memory limit this test sets
for its own child, a lone surrogate, JSON nested too deep, a chat template that raises. Each through the real
`python -m pipeline.extract` (HF engine, the tiny default), asserting the exit code, the reject's reason and size,
the summary's counts, and that every valid record was written."""
from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.helpers import REPO
from tests.helpers.runs import env_with, extract, extract_cmd, output, verify

pytestmark = pytest.mark.reliability

GOOD = [{"messages": [{"role": "user", "content": f"Name prime number {i}."},
                      {"role": "assistant", "content": f"Prime number {i} is {p}."}]}
        for i, p in enumerate([2, 3, 5, 7, 11, 13], start=1)]
RUN = ("gate.mode=off", "runner.max_tokens_per_shard=800")
HUGE_BYTES = 200 * 2**20
# The child's address-space limit: the tiny default's extract maps about 2 GiB (torch, the model, the engine);
# tokenising the 200 MB record would take about 20 GB.
MEMORY_LIMIT = 4 * 2**30


def write_data(path: Path, bad: dict[int, str]) -> Path:
    """The good records, with the raw line `bad[i]` written before good record i (so its row is known)."""
    with open(path, "w", encoding="utf-8") as f:
        for i, record in enumerate(GOOD):
            if i in bad:
                f.write(bad[i] + "\n")
            f.write(json.dumps(record) + "\n")
    return path


def written_rows(out: Path) -> list[int]:
    """The data rows of every written sample, from the shards' Parquet tables."""
    return sorted(row for table in sorted((out / "shards").glob("*.parquet"))
                  for row in pq.read_table(table, columns=["row"]).column("row").to_pylist())


def rejects(out: Path) -> dict[int, tuple[str, str]]:
    return {r["row"]: (r["reason"], r["detail"]) for r in pq.read_table(out / "rejects.parquet").to_pylist()}


def good_rows(bad: dict[int, str]) -> list[int]:
    """The file rows of the good records: good record i comes after the bad lines written before it."""
    return [i + sum(1 for j in bad if j <= i) for i in range(len(GOOD))]


def bad_rows(bad: dict[int, str]) -> list[int]:
    return [i + sum(1 for j in bad if j < i) for i in sorted(bad)]


def summary_line(done: subprocess.CompletedProcess) -> str:
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("wrote ")]
    return line


def test_a_lone_surrogate_and_deep_nesting_are_rejects_and_the_rest_is_written(tmp_path):
    surrogate = json.dumps({"messages": [{"role": "user", "content": "hi"},
                                         {"role": "assistant", "content": "half \ud800 a character"}]})
    assert "\\ud800" in surrogate  # the JSON escape, as scraped data holds it: valid JSON
    deep = '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}], "meta": ' \
           + "[" * 100_000 + "]" * 100_000 + "}"  # deeper than Python's JSON decoder follows (a RecursionError)
    nested = '{"text": "x", "meta": ' + "[" * 80 + "]" * 80 + "}"  # decodes, but deeper than the bound
    bad = {1: surrogate, 3: deep, 4: nested}
    out = tmp_path / "run"
    done = extract(out, f"data.path={write_data(tmp_path / 'data.jsonl', bad)}", *RUN)
    assert done.returncode == 0, output(done)[-3000:]
    assert written_rows(out) == good_rows(bad)
    found = rejects(out)
    rows = bad_rows(bad)
    assert found[rows[0]][0] == "invalid_text" and "lone surrogate U+D800" in found[rows[0]][1]
    assert found[rows[1]][0] == "too_deep" and found[rows[2]][0] == "too_deep" and len(found) == 3
    assert "3 rejected (too_deep: 2, invalid_text: 1; see rejects.parquet)" in summary_line(done)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["rejects"]["by_reason"] == {"invalid_text": 1, "too_deep": 2}
    assert manifest["num_samples"] == len(GOOD) and "Traceback" not in output(done)
    assert verify(out).returncode == 0


def _strict_checkpoint(default_model: Path, tmp_path: Path) -> Path:
    """A user's copy of the tiny default whose chat template checks each message as real templates do (one refusal
    through raise_exception, one Python error inside the template: a string minus a number), and whose tiktoken
    tokenizer declares `<|endoftext|>` and encodes with tiktoken's default, which refuses text holding it (as a
    scraped document may)."""
    ckpt = tmp_path / "my-checkpoint"
    shutil.copytree(default_model, ckpt, ignore=shutil.ignore_patterns(".built.json"))
    template = ckpt / "chat_template.jinja"
    checks = ("{%- for message in messages -%}"
              "{%- if message['role'] == 'system' and not loop.first -%}"
              "{{- raise_exception('the system message must come first') -}}{%- endif -%}"
              "{%- if message['content'] is string and message['content'].startswith('#') -%}"
              "{%- set _ = message['content'] - 1 -%}{%- endif -%}"
              "{%- endfor -%}")
    template.write_text(checks + template.read_text())
    code = ckpt / "tokenization_kimi.py"
    source = code.read_text()
    strict = source.replace("special_tokens={}", 'special_tokens={"<|endoftext|>": len(ranks)}').replace(
        "self._encoding.encode_ordinary(text)", "self._encoding.encode(text)")
    assert strict.count("<|endoftext|>") == 1 and "encode_ordinary" not in strict
    code.write_text(strict)
    return ckpt


def test_a_template_or_tokenizer_error_on_one_record_is_its_reject(tmp_path, tiny_model):
    ckpt = _strict_checkpoint(tiny_model("tiny-k25-int4-8l"), tmp_path)
    late_system = json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "system", "content": "late"},
                                           {"role": "assistant", "content": "ok"}]})
    hashed = json.dumps({"messages": [{"role": "user", "content": "#hi"}, {"role": "assistant", "content": "ok"}]})
    endoftext = json.dumps({"text": "the end of one document <|endoftext|> and the next"})
    bad = {0: late_system, 2: hashed, 4: endoftext}
    out = tmp_path / "run"
    done = extract(out, f"data.path={write_data(tmp_path / 'data.jsonl', bad)}", *RUN, f"model.path={ckpt}",
                   "model.build=null", "model.trust_remote_code=true", "model.points=[embed,1,4,7,final_norm]")
    assert done.returncode == 0, output(done)[-3000:]
    assert written_rows(out) == good_rows(bad)
    found = rejects(out)
    first, second, third = (found[row] for row in bad_rows(bad))
    assert first[0] == "template_error" and "the system message must come first" in first[1]
    assert second[0] == "template_error" and "TypeError" in second[1]
    assert third[0] == "tokenizer_error" and "disallowed special token" in third[1]
    assert "3 rejected (template_error: 2, tokenizer_error: 1; see rejects.parquet)" in summary_line(done)


def _write_huge(path: Path) -> int:
    """GOOD with one 200 MB record before good record 3, written a block at a time; the record's size in bytes."""
    block = "x" * 2**23
    with open(path, "w", encoding="utf-8") as f:
        for i, record in enumerate(GOOD):
            if i == 3:
                head, tail = '{"messages": [{"role": "user", "content": "', '"}, ' \
                             '{"role": "assistant", "content": "ok"}]}'
                f.write(head)
                for _ in range(HUGE_BYTES // len(block)):
                    f.write(block)
                f.write(tail + "\n")
            f.write(json.dumps(record) + "\n")
    return len(head) + HUGE_BYTES + len(tail)


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def test_a_200_mb_record_is_rejected_with_its_size_under_a_memory_limit(tmp_path):
    """Under the default length_policy=truncate (which could have cut it): the record is over the bound one record
    may take, so it is measured as it is read, never held, and rejected (tests/unit/test_record_bounds.py covers
    length_policy=reject)."""
    data = tmp_path / "data.jsonl"
    size = _write_huge(data)
    out, log = tmp_path / "run", tmp_path / "extract.log"
    # Fewer malloc arenas and threads: the address space the child maps does not grow with the machine's cores.
    env = env_with(MALLOC_ARENA_MAX="2", OMP_NUM_THREADS="2")
    with open(log, "w") as sink:
        child = subprocess.Popen(extract_cmd(out, f"data.path={data}", *RUN),
                                 cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT, text=True,
                                 preexec_fn=_limited)
        _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    text = log.read_text()
    assert child.returncode == 0, text[-3000:]
    peak_rss = usage.ru_maxrss * 1024  # kB on Linux
    print(f"extract with one {size:,}-byte record: peak RSS {peak_rss / 2**30:.2f} GiB "
          f"(address space limited to {MEMORY_LIMIT / 2**30:.0f} GiB)")
    assert peak_rss < MEMORY_LIMIT / 2
    assert written_rows(out) == [0, 1, 2, 4, 5, 6]
    ((row, (reason, detail)),) = rejects(out).items()
    assert (row, reason) == (3, "too_long")
    assert f"line 4: the record is {size:,} bytes, more than the" in detail and "data.max_length=2048" in detail
    assert "1 rejected (too_long: 1; see rejects.parquet)" in text
