"""The configuration reference, generated from the typed schema: every key of every job's config with its type, its
default and the comment that documents it in the schema's source, every engine's options, every config group's
choices. docs/reference/configuration.md is built from `markdown()` (docs/_ext/reference.py); a key without a doc
line fails the docs test, so the schema stays the one place a setting is described.
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import textwrap
import tokenize
import typing
from dataclasses import dataclass
from typing import Any

from omegaconf import MISSING

from pipeline.config.compose import JOBS
from pipeline.config.entries import CONF_DIR

COMMANDS = {"config": "extract", "regenerate": "regenerate", "diff": "diff"}


@dataclass(frozen=True)
class Key:
    path: str  # dotted, `<dtype>` where a mapping's key is the user's (diff.thresholds.<dtype>.rel_l2)
    type: str
    default: str
    doc: str


def field_docs(cls: type) -> dict[str, str]:
    """Each field's documentation: its `doc` metadata, else the comment on its lines, else the comment lines directly
    above it (a comment block belongs to the field it precedes)."""
    lines, _ = inspect.getsourcelines(cls)
    source = textwrap.dedent("".join(lines))
    own_line, trailing = {}, {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            text = tok.string.lstrip("#").strip()
            target = own_line if tok.line.strip().startswith("#") else trailing
            target[tok.start[0]] = text
    docs = {}
    body = ast.parse(source).body[0].body  # type: ignore[attr-defined]
    for node in body:
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        inline = [trailing[n] for n in range(node.lineno, node.end_lineno + 1) if n in trailing]
        above, n = [], node.lineno - 1
        while n in own_line:
            above.insert(0, own_line[n])
            n -= 1
        docs[node.target.id] = " ".join(inline or above)
    for f in dataclasses.fields(cls):
        if f.metadata.get("doc"):
            docs[f.name] = f.metadata["doc"]
    return docs


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return MISSING


def _shown(value: Any) -> str:
    if value is MISSING or value == MISSING:
        return "required"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value) if isinstance(value, str) else repr(value)


def _type_name(hint: Any) -> str:
    text = str(hint).replace("typing.", "").replace("NoneType", "None")
    return getattr(hint, "__name__", text) if not typing.get_args(hint) else text


def keys(schema: type, prefix: str = "") -> list[Key]:
    """Every key under `schema`, depth first in declaration order; a nested dataclass's keys follow its own."""
    hints, docs = typing.get_type_hints(schema), field_docs(schema)
    out = []
    for f in dataclasses.fields(schema):
        path, hint = f"{prefix}{f.name}", hints[f.name]
        args = typing.get_args(hint)
        if dataclasses.is_dataclass(hint):
            out.append(Key(path, "group", "", docs.get(f.name) or _docstring(hint)))
            out += keys(hint, f"{path}.")
        elif typing.get_origin(hint) is dict and len(args) == 2 and dataclasses.is_dataclass(args[1]):
            out.append(Key(path, f"mapping of {args[1].__name__}", _shown(sorted(_default(f))), docs.get(f.name, "")))
            out += keys(args[1], f"{path}.<{_placeholder(path)}>.")
        else:
            out.append(Key(path, _type_name(hint), _shown(_default(f)), docs.get(f.name, "")))
    return out


def _docstring(cls: type) -> str:
    """The class's own docstring's first paragraph; dataclass's generated signature is none."""
    doc = inspect.getdoc(cls) or ""
    return "" if doc.startswith(f"{cls.__name__}(") else doc.split("\n\n")[0]


def _placeholder(path: str) -> str:
    return "dtype" if path.endswith("thresholds") else "key"


def groups() -> dict[str, list[tuple[str, str]]]:
    """conf/ group -> (choice, the first comment line of its file)."""
    out = {}
    for group in sorted(d for d in CONF_DIR.iterdir() if d.is_dir()):
        out[group.name] = [(f.stem, _first_comment(f.read_text())) for f in sorted(group.glob("*.yaml"))]
    return out


def _first_comment(text: str) -> str:
    comments = [line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")]
    return next((c for c in comments if c and not c.startswith("@package")), "")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(rows: list[Key], used_by: dict[str, list[str]] | None = None) -> list[str]:
    head = "| key | type | default | meaning |" + (" used by |" if used_by else "")
    lines = [head, "| --- " * (5 if used_by else 4) + "|"]
    for k in rows:
        cells = [f"`{k.path}`", _cell(k.type), f"`{_cell(k.default)}`" if k.default else "", _cell(k.doc)]
        if used_by:
            cells.append(", ".join(used_by[k.path]))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def job_keys() -> dict[str, list[Key]]:
    """command -> its config's keys."""
    return {COMMANDS[name]: keys(schema) for name, schema in JOBS.items()}


def markdown(options: dict[str, type]) -> str:
    """The configuration reference page, in MyST Markdown; `options`: engine name -> its options class (the engines
    are a layer above this one, so the caller hands them in)."""
    per_job = job_keys()
    merged: dict[str, Key] = {}
    used_by: dict[str, list[str]] = {}
    for command, rows in per_job.items():
        for k in rows:
            merged.setdefault(k.path, k)
            used_by.setdefault(k.path, []).append(command)
    out = [
        "# Configuration", "",
        "Generated from the typed schema (`pipeline/config/schema.py`, `pipeline/config/regen_schema.py`,",
        "`pipeline/core/contracts.py`, the engines' options classes) when the site is built: each meaning is the",
        "comment beside the key in the schema's source. The schema is the one source of defaults; a `conf/` group",
        "holds only what choosing it changes. Every job's config is closed: a key its schema does not declare is a",
        "configuration error (exit 2) naming the closest valid key. Keys are set as Hydra overrides",
        "(`runner.storage_dtype=float8_e4m3fn`); a group is chosen by name (`model=tiny_llama`).", "",
    ]
    top = [k for k in merged.values() if "." not in k.path and k.type != "group"]
    out += ["## Top-level keys", "", *_table(top, used_by), ""]
    for k in merged.values():
        if "." in k.path or k.type != "group":
            continue
        rows = [r for r in merged.values() if r.path.startswith(k.path + ".")]
        out += [f"## {k.path}", "", _cell(k.doc), "", *_table(rows, used_by), ""]
    out += ["## Engine options", "",
            "`engine.options` (and `options` of a `diff.reference`, `diff.engines` or `gate.engines` entry) are",
            "typed per engine and checked before any engine starts; `vllm-speculate` is the engine",
            "`pipeline.accept` measures with (its `--engine-option KEY=VALUE`).", ""]
    for name, cls in sorted(options.items()):
        out += [f"### {name}", "", *_table(keys(cls)), ""]
    out += ["## Config groups", "", "Chosen by name (`model=tiny_llama`, `runner=ray`); `exp` is added with `+`",
            "(`+exp=kimi`). Each choice is a file `conf/<group>/<choice>.yaml`.", ""]
    for group, choices in groups().items():
        out += [f"### {group}", "", "| choice | what it is |", "| --- | --- |"]
        out += [f"| `{group}={choice}` | {_cell(doc)} |" for choice, doc in choices]
        out.append("")
    return "\n".join(out)
