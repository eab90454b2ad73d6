"""Sphinx extension: writes the generated reference pages when the build starts.

- reference/configuration.md from the typed schema (`pipeline.config.reference`) and the engines' options classes;
- reference/commands.md from the entry points' own argparse parsers and the Hydra jobs' schemas.

Both files are build outputs (ignored by git): what they say can only be what the code declares.
"""
from __future__ import annotations

import argparse
import importlib
from pathlib import Path

from pipeline.config import reference
from pipeline.engines import registry

HYDRA = {  # command -> (conf/ primary config, what it does)
    "extract": ("config", "capture hidden states into a run directory (the main job)"),
    "regenerate": ("regenerate", "the target writes the answers of a conversation set, token ids kept"),
    "diff": ("diff", "the same probe prompts through several engines, compared point by point"),
}
ARGPARSE = {  # command -> module holding parser()
    "verify": "pipeline.verify",
    "export": "pipeline.export",
    "doctor": "pipeline.doctor",
    "accept": "pipeline.accept",
    "factory": "pipeline.factory.tiny",
    "compare.html": "pipeline.compare.html",
}
CONSOLE = {"extract", "regenerate", "diff", "verify", "export", "doctor", "accept"}
GENERATED = ("reference/configuration.md", "reference/commands.md")


def _anchor(title: str) -> str:
    return "".join(c for c in title.lower().replace(" ", "-") if c.isalnum() or c in "-_")


def _cell(text: str) -> str:
    return " ".join(str(text).replace("|", "\\|").split())


def _arguments(parser: argparse.ArgumentParser) -> list[str]:
    rows = ["| argument | default | meaning |", "| --- | --- | --- |"]
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        name = ", ".join(action.option_strings) or action.dest
        metavar = action.metavar or ("{" + ",".join(map(str, action.choices)) + "}" if action.choices else None)
        if action.option_strings and action.nargs != 0:
            name += f" {metavar or action.dest.upper()}"
        default = "" if action.default in (None, False, argparse.SUPPRESS) or action.required else action.default
        rows.append(f"| `{_cell(name)}` | {f'`{_cell(default)}`' if default != '' else ''} | {_cell(action.help or '')} |")
    return rows


def commands_markdown() -> str:
    out = ["# Commands", "",
           "Generated from the entry points when the site is built. Every command is `python -m pipeline.<name>`; the",
           "seven stages are also console scripts (`pipeline-extract`, ...) once `scripts/setup.sh` has installed the",
           "package. Exit codes: [Exit codes](exit-codes.md).", ""]
    for command, (config, what) in HYDRA.items():
        out += [f"## {command}", "", f"{what[0].upper()}{what[1:]}.", "", "```text",
                f"python -m pipeline.{command} [GROUP=CHOICE ...] [KEY=VALUE ...] [+exp=NAME]", "```", "",
                f"A Hydra command: its arguments are overrides of `conf/{config}.yaml`, whose keys are the "
                f"[configuration reference](configuration.md) entries marked *{command}* under \"used by\". Hydra's own "
                "flags work: `--cfg job` prints the composed config and runs nothing, `-m` sweeps, "
                "`hydra.verbose=pipeline` shows the traceback behind an error line.", ""]
        if command in CONSOLE:
            out += [f"Console script: `pipeline-{command}`.", ""]
    for command, module in ARGPARSE.items():
        parser = importlib.import_module(module).parser()
        out += [f"## {command}", "", _cell(parser.description or ""), "", "```text",
                parser.format_usage().strip().removeprefix("usage: "), "```", "", *_arguments(parser), ""]
        if command in CONSOLE:
            out += [f"Console script: `pipeline-{command}`.", ""]
    return "\n".join(out)


def _write(app) -> None:
    src = Path(app.srcdir)
    pages = {"reference/configuration.md": reference.markdown(registry.options_classes()),
             "reference/commands.md": commands_markdown()}
    for rel, text in pages.items():
        path = src / rel
        if not path.exists() or path.read_text() != text:  # unchanged bytes keep Sphinx's incremental build
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)


def setup(app):
    app.connect("builder-inited", _write)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
