"""accept's prompts are bounded by the length the target serves (#35 item 4): a prompt over it is a reject, and one
far over it is never read or tokenised whole (before, `read_prompts(..., max_length=1 << 20)` lifted every bound and a
200 MB prompt took ~20 GB). Checked through `prepare`, which reads everything before any engine starts."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pipeline.acceptance.measure import prepare
from pipeline.acceptance.report import Settings
from pipeline.core.cli import UsageError
from tests.helpers import REPO
from tests.helpers.drafts import make_draft

SETTINGS = Settings(num_speculative_tokens=3, max_tokens=8, temperature=0.0, dtype="float32")


def _prompts(path, *texts):
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": t}]}) + "\n" for t in texts))
    return path


def _prepare(tmp_path, models_root, prompts, settings=SETTINGS):
    config = json.loads((models_root / "tiny-llama" / "config.json").read_text())
    draft = make_draft(tmp_path / "draft", config, schema="speculators", aux_ids=[1, 3, 5])
    return prepare([draft], target=models_root / "tiny-llama", run=None, export=None, prompts=prompts,
                   out=tmp_path / "out", overwrite=False, settings=settings)


def test_a_prompt_over_the_served_length_is_a_reject(tmp_path, models_root, tiny_model):
    tiny_model("tiny-llama")  # 4096 positions: at most 4096 - 8 - 3 - 1 prompt tokens
    prompts = _prompts(tmp_path / "p.jsonl", "Name three colours.", "word " * 5000, "x" * 3_000_000)
    plan = _prepare(tmp_path, models_root, prompts)
    assert len(plan.prompt_ids) == 1 and plan.rejected == 2
    with pytest.raises(UsageError, match=r"no chat record to prompt with \(1 rejected; a prompt may hold at most"):
        _prepare(tmp_path / "b", models_root, _prompts(tmp_path / "q.jsonl", "word " * 5000))
    with pytest.raises(UsageError, match=r"--max-tokens 5000: leaves no room for a prompt in the target's 4096"):
        _prepare(tmp_path / "c", models_root, prompts, Settings(num_speculative_tokens=3, max_tokens=5000,
                                                                 temperature=0.0, dtype="float32"))


def test_a_huge_prompt_is_never_read_whole(tmp_path, models_root, tiny_model):
    """200 MB on one line under a 6 GiB address-space cap (the previous code aborted in the tokenizer, rc 134): rejected
    unread, the valid prompt kept."""
    tiny_model("tiny-llama")
    prompts = tmp_path / "p.jsonl"
    with prompts.open("w") as f:
        f.write(json.dumps({"messages": [{"role": "user", "content": "Name three colours."}]}) + "\n")
        f.write('{"messages": [{"role": "user", "content": "' + "y" * 200_000_000 + '"}]}\n')
    code = (f"import json, resource, sys; sys.path.insert(0, {str(REPO)!r})\n"
            "from tests.unit.test_accept_prompts import _prepare\nfrom pathlib import Path\n"
            "resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))\n"
            f"plan = _prepare(Path({str(tmp_path)!r}), Path({str(models_root)!r}), Path({str(prompts)!r}))\n"
            "print(json.dumps([len(plan.prompt_ids), plan.rejected]))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [1, 1]
