"""The documentation's command blocks, and running them as a user would (tests/docs/test_commands.py).

Every ```bash block of README.md and docs/ is one of:
- run (no mark): the blocks of a page run in order, each `bash -euo pipefail`, in one scratch directory per page that
  links the checkout's environments, models and sources; a non-zero exit or an error line fails it;
- `<!-- not-run: WHY -->` on the line above the fence: needs what CI lacks (GPUs, Kimi-K2.5's weights, a cluster);
  each of its commands is checked as far as a machine without them can: a Hydra command composes with `--cfg job`,
  an argparse command is parsed by its own parser; anything else is listed as not checked;
- `<!-- ran-by: PATH -->`: a test (or .ci/run) that holds each of its commands verbatim runs it.
Any other fence language that names a shell (sh, shell, console, zsh) is refused: it would escape the harness.
"""
from __future__ import annotations

import hashlib
import importlib
import os
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from markdown_it import MarkdownIt

REPO = Path(__file__).resolve().parents[2]
SHELLS = {"sh", "shell", "console", "zsh", "shell-session"}
MARK = re.compile(r"^<!--\s*(not-run|ran-by):\s*(.+?)\s*-->\s*$")
ERROR_LINE = re.compile(r"^(Traceback \(most recent call last\)|error:|configuration error:)", re.M)
LINKED = (".venv", ".venv-vllm", ".venv-sglang", ".venv-speculators", ".venv-specforge", ".cache", "pipeline", "conf",
          "scripts", "requirements", "tests", "bench", "jobs", "docs", "pyproject.toml", "README.md", ".ci")
HYDRA = {"extract", "regenerate", "diff"}
ARGPARSE = {"verify": "pipeline.verify", "export": "pipeline.export", "doctor": "pipeline.doctor",
            "accept": "pipeline.accept", "factory": "pipeline.factory.tiny", "compare.html": "pipeline.compare.html"}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    text: str
    mark: str  # run | not-run | ran-by
    why: str = ""  # not-run: the reason; ran-by: the file

    @property
    def where(self) -> str:
        return f"{_rel(self.page)}:{self.line}"

    def commands(self) -> list[str]:
        """One string per command: continuation lines joined, comments and blank lines dropped."""
        joined = re.sub(r"\\\n\s*", " ", self.text)
        return [line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


@dataclass
class Outcome:
    block: Block
    ok: bool
    detail: str = ""
    checked: list[str] = field(default_factory=list)


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)


def pages(root: Path = REPO) -> list[Path]:
    docs = sorted(p for p in (root / "docs").rglob("*.md") if "_build" not in p.parts and "_ext" not in p.parts)
    return [root / "README.md", *docs]


def blocks(page: Path) -> list[Block]:
    """The page's command blocks, in order; ValueError names a shell fence that is not ```bash or a stray mark."""
    text = page.read_text()
    tokens = MarkdownIt("commonmark").parse(text)
    out = []
    for i, tok in enumerate(tokens):
        if tok.type != "fence":
            continue
        lang = tok.info.strip().split()[0] if tok.info.strip() else ""
        line = tok.map[0] + 1
        if lang in SHELLS:
            raise ValueError(f"{_rel(page)}:{line}: a ```{lang} block: shell commands go in ```bash blocks "
                             "(run or marked), anything else in ```text")
        if lang != "bash":
            continue
        prev = tokens[i - 1] if i else None
        mark = MARK.match(prev.content.strip()) if prev is not None and prev.type == "html_block" else None
        if mark and prev.map[1] != tok.map[0]:
            raise ValueError(f"{_rel(page)}:{line}: the mark above this block is not on the line before its fence")
        out.append(Block(page, line, tok.content, mark[1] if mark else "run", mark[2] if mark else ""))
    return out


def _setup_is_current() -> None:
    """`bash scripts/setup.sh` in a scratch directory must find nothing to install: an install there would point the
    editable package at the scratch directory, which is removed after the test."""
    stamp = hashlib.sha256((REPO / "pyproject.toml").read_bytes() + (REPO / "scripts/setup.sh").read_bytes())
    if not (REPO / ".venv" / f".installed-{stamp.hexdigest()[:16]}").exists():
        raise RuntimeError(f"{REPO}/.venv is older than pyproject.toml or scripts/setup.sh: run bash scripts/setup.sh "
                           "in the checkout first")


def scratch(workdir: Path) -> Path:
    """A directory where a page's commands run as in a checkout: the checkout's entries linked, outputs its own."""
    _setup_is_current()
    workdir.mkdir(parents=True, exist_ok=True)
    for name in LINKED:
        if (REPO / name).exists() and not (workdir / name).exists():
            (workdir / name).symlink_to(REPO / name)
    return workdir


def run_block(block: Block, workdir: Path, timeout: float = 1500) -> Outcome:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PIPELINE_FAULT"))}
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block.text], cwd=workdir, env=env, timeout=timeout,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    errors = ERROR_LINE.findall(proc.stdout)
    if proc.returncode != 0 or errors:
        tail = "\n".join(proc.stdout.splitlines()[-15:])
        return Outcome(block, False, f"{block.where}: exit {proc.returncode}, {len(errors)} error line(s):\n{tail}")
    return Outcome(block, True)


def _pipeline_command(argv: list[str]) -> tuple[str, list[str]] | None:
    """(command, its arguments) for `[ENV=..] [.venv/bin/]python -m pipeline.X ...` or `pipeline-X ...`."""
    while argv and re.match(r"^[A-Z_][A-Z0-9_]*=", argv[0]):
        argv = argv[1:]
    if len(argv) >= 3 and argv[0].endswith("python") and argv[1] == "-m" and argv[2].startswith("pipeline."):
        return argv[2].removeprefix("pipeline."), argv[3:]
    if argv and argv[0].startswith("pipeline-"):
        return argv[0].removeprefix("pipeline-"), argv[1:]
    return None


def check_block(block: Block, workdir: Path) -> Outcome:
    """A not-run block's commands checked without running them: Hydra ones composed, argparse ones parsed."""
    checked, problems = [], []
    for command in block.commands():
        for part in re.split(r"\s*(?:&&|\|\||;)\s*", command):
            found = _pipeline_command(shlex.split(part, comments=True)) if part else None
            if found is None:
                checked.append(f"not checked: {part}")
                continue
            name, args = found
            if name in HYDRA:
                proc = subprocess.run([str(REPO / ".venv/bin/python"), "-m", f"pipeline.{name}", *args, "--cfg", "job"],
                                      cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      timeout=300)
                if proc.returncode != 0 or ERROR_LINE.search(proc.stdout):
                    problems.append(f"{part}: --cfg job says: {proc.stdout.strip().splitlines()[-1:]}")
            elif name in ARGPARSE:
                try:
                    importlib.import_module(ARGPARSE[name]).parser().parse_args(args)
                except SystemExit:
                    problems.append(f"{part}: its parser refuses these arguments")
            else:
                problems.append(f"{part}: pipeline.{name} is not a command this harness knows")
                continue
            checked.append(f"checked: {part}")
    return Outcome(block, not problems, f"{block.where}: " + "; ".join(problems) if problems else "", checked)


def check_ran_by(block: Block) -> Outcome:
    holder = REPO / block.why
    if not holder.is_file():
        return Outcome(block, False, f"{block.where}: ran-by names {block.why}, which is not a file")
    text = holder.read_text()
    missing = [c for c in block.commands() if c not in text]
    if missing:
        return Outcome(block, False, f"{block.where}: {block.why} does not hold {missing} as written")
    return Outcome(block, True)


def run_page(page: Path, workdir: Path) -> list[Outcome]:
    """Every block of the page in order; one that fails is reported, and the page's later blocks still checked."""
    scratch(workdir)
    outcomes = []
    for block in blocks(page):
        if block.mark == "run":
            outcomes.append(run_block(block, workdir))
        elif block.mark == "not-run":
            outcomes.append(check_block(block, workdir))
        else:
            outcomes.append(check_ran_by(block))
    return outcomes


def inventory(root: Path = REPO) -> str:
    """One line per kind: how many blocks run, are marked not run (and why), are run by a named test."""
    counts: dict[str, list[Block]] = {"run": [], "not-run": [], "ran-by": []}
    for page in pages(root):
        for block in blocks(page):
            counts[block.mark].append(block)
    lines = [f"documented command blocks: {len(counts['run'])} run, {len(counts['ran-by'])} run by a named test, "
             f"{len(counts['not-run'])} not run"]
    lines += [f"  not run, {b.where}: {b.why}" for b in counts["not-run"]]
    return "\n".join(lines)
