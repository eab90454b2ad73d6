"""Every shell command of README.md and docs/ is run as written, or marked and checked as far as CI can
(tests/helpers/docblocks.py says how); a block that is neither run nor marked cannot exist, and one that fails fails
here. `pytest` prints the inventory (run / run by a named test / not run and why) in its summary."""
from __future__ import annotations

import pytest

from tests.helpers import REPO
from tests.helpers.docblocks import blocks, check_block, check_ran_by, pages, run_page

PAGES = [p for p in pages() if blocks(p)]


@pytest.mark.slow
@pytest.mark.timeout(2400)
@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_the_page_commands_run(page, tmp_path):
    failed = [o.detail for o in run_page(page, tmp_path / "work") if not o.ok]
    assert not failed, "\n\n".join(failed)


def test_every_page_parses_and_every_block_is_known():
    """A ```sh block, a mark not directly above its fence: refused when the pages are read (here, for every page)."""
    for page in pages():
        blocks(page)


def _page(tmp_path, body: str):
    page = tmp_path / "scratch.md"
    page.write_text(body)
    return page


def test_an_unmarked_failing_block_fails(tmp_path):
    page = _page(tmp_path, "# t\n\n```bash\necho fine\n```\n\n```bash\nls no-such-file\necho after\n```\n")
    outcomes = run_page(page, tmp_path / "work")
    assert [o.ok for o in outcomes] == [True, False]
    assert "scratch.md:7: exit 2" in outcomes[1].detail and "no-such-file" in outcomes[1].detail


def test_an_error_line_fails_a_block_that_exits_0(tmp_path):
    page = _page(tmp_path, "```bash\necho 'error: the disk is full' >&2; true\n```\n")
    [outcome] = run_page(page, tmp_path / "work")
    assert not outcome.ok and "1 error line" in outcome.detail


def test_a_page_blocks_share_their_scratch_directory(tmp_path):
    page = _page(tmp_path, "```bash\nmkdir -p runs/x && echo 1 > runs/x/f\n```\n\n```bash\ntest -f runs/x/f\n```\n")
    assert all(o.ok for o in run_page(page, tmp_path / "work"))


def test_a_shell_fence_that_is_not_bash_is_refused(tmp_path):
    page = _page(tmp_path, "```console\n$ rm -rf /\n```\n")
    with pytest.raises(ValueError, match=r"scratch.md:1: a ```console block"):
        blocks(page)


def test_a_mark_must_sit_on_the_line_above_the_fence(tmp_path):
    page = _page(tmp_path, "<!-- not-run: needs 8 GPUs -->\n\nSome text.\n\n```bash\nfalse\n```\n")
    assert blocks(page)[0].mark == "run"  # a mark elsewhere marks nothing: the block is run


def test_a_not_run_block_is_still_checked(tmp_path):
    ok = blocks(_page(tmp_path, "<!-- not-run: needs 8 GPUs -->\n```bash\n"
                      ".venv/bin/python -m pipeline.extract +exp=kimi model.path=/models/Kimi-K2.5 \\\n"
                      "    data.path=/data/conv.jsonl\n"
                      ".venv/bin/python -m pipeline.verify /data/run --key run.pub\n"
                      "nvidia-smi -L\n```\n"))[0]
    outcome = check_block(ok, REPO)
    assert outcome.ok, outcome.detail
    assert [c.split(":")[0] for c in outcome.checked] == ["checked", "checked", "not checked"]
    bad = blocks(_page(tmp_path, "<!-- not-run: needs 8 GPUs -->\n```bash\n"
                       ".venv/bin/python -m pipeline.extract +exp=kimi runer.num_replicas=2\n"
                       ".venv/bin/python -m pipeline.export RUN --format nonsense --out X\n```\n"))[0]
    outcome = check_block(bad, REPO)
    assert not outcome.ok
    assert "runer.num_replicas" in outcome.detail and "--format nonsense" in outcome.detail


def test_ran_by_must_name_a_file_holding_the_command_verbatim(tmp_path):
    held = blocks(_page(tmp_path, "<!-- ran-by: .ci/run -->\n```bash\n"
                        "bash scripts/setup.sh && .venv/bin/python -m pytest\n```\n"))[0]
    assert check_ran_by(held).ok
    changed = blocks(_page(tmp_path, "<!-- ran-by: .ci/run -->\n```bash\n"
                           "bash scripts/setup.sh && .venv/bin/python -m pytest -x\n```\n"))[0]
    assert not check_ran_by(changed).ok
