"""Remote code in a checkpoint directory: which Python files its configs point at, whether loading it needs them, and
their digests.

A checkpoint's `config.json` and `tokenizer_config.json` may name classes in its own .py files (`auto_map`), which
transformers imports, that is runs, when asked to with `trust_remote_code`. The pipeline never does so silently:
`model.trust_remote_code` must say so, and provenance records the setting and the sha256 of every such file. With the
setting off, such a checkpoint loads through the built-in classes where they can read it (one warning line, and
provenance lists the declared files that did not run), and is refused, naming the class that is missing, where they
cannot.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pipeline.core.io import sha256_file
from pipeline.core.jsonfile import read_lenient

log = logging.getLogger(__name__)
SETTING = "model.trust_remote_code"
# The configs whose auto_map the data layer and the engines follow (the processor's is never loaded: text only).
CONFIG_FILES = {"config.json": "AutoConfig", "tokenizer_config.json": "AutoTokenizer"}


class RemoteCodeError(ValueError):
    """A checkpoint that cannot load without running its own code, while model.trust_remote_code is off."""


def _read_json(path: Path) -> dict[str, Any]:
    return read_lenient(path) or {}  # bounded in size and nesting; a file that is no JSON object declares nothing


def _modules(references: Any) -> list[str]:
    """Module names of an auto_map entry: "module.Class", or a [slow, fast] pair of them (None = absent)."""
    names = references if isinstance(references, (list, tuple)) else [references]
    return [name.split("--")[-1].rsplit(".", 1)[0] for name in names if isinstance(name, str)]


def auto_map_modules(model_dir: Path) -> dict[str, list[str]]:
    """config file -> the module files its auto_map points at, e.g. {"tokenizer_config.json":
    ["tokenization_kimi.py"]}."""
    found = {}
    for config_name in CONFIG_FILES:
        auto_map = _read_json(Path(model_dir) / config_name).get("auto_map") or {}
        files = sorted({f"{module}.py" for refs in auto_map.values() for module in _modules(refs)})
        if files:
            found[config_name] = files
    return found


def _needed_by(model_dir: Path) -> dict[str, str]:
    """What cannot load without the checkpoint's own code: config file -> the built-in class transformers lacks for
    it (a tokenizer class, a config class for the model_type)."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    model_dir = Path(model_dir)
    needed = {}
    tokenizer = _read_json(model_dir / "tokenizer_config.json")
    tokenizer_class = tokenizer.get("tokenizer_class")
    if "AutoTokenizer" in (tokenizer.get("auto_map") or {}) and (
            not tokenizer_class or tokenizer_class_from_name(tokenizer_class) is None):
        needed["tokenizer_config.json"] = f"tokenizer class {tokenizer_class!r}" if tokenizer_class else \
            "tokenizer class (tokenizer_config.json names none)"
    config = _read_json(model_dir / "config.json")
    if "AutoConfig" in (config.get("auto_map") or {}) and config.get("model_type") not in CONFIG_MAPPING:
        needed["config.json"] = f"config class for model_type {config.get('model_type')!r}"
    return needed


def _declared_text(model_dir: Path, names: list[str] | None = None) -> str:
    modules = auto_map_modules(model_dir)
    return "; ".join(f"{name} auto_map -> {', '.join(files)}" for name, files in modules.items()
                     if names is None or name in names)


def check_remote_code(model_dir: Path, trust_remote_code: bool) -> None:
    """Raise RemoteCodeError (one line, naming the setting) when the checkpoint needs its own code, which it may not
    run: transformers has no built-in class that reads it."""
    if trust_remote_code:
        return
    needed = _needed_by(Path(model_dir))
    if needed:
        lacks = " and no ".join(needed.values())
        raise RemoteCodeError(f"model.path={str(model_dir)!r} loads only by running its own Python code, refused: "
                              f"{SETTING} is off and transformers has no built-in {lacks} to read it instead "
                              f"({_declared_text(Path(model_dir), list(needed))}); set {SETTING}=true if you trust "
                              f"that code")


def skipped_code_line(model_dir: Path, trust_remote_code: bool) -> str | None:
    """The warning for a checkpoint that declares its own code which the setting does not let run (it loads through
    the built-in classes instead); None when nothing declared is skipped."""
    if trust_remote_code or not auto_map_modules(Path(model_dir)):
        return None
    return (f"model.path={str(model_dir)!r} declares its own code ({_declared_text(Path(model_dir))}), not run: "
            f"{SETTING} is off, so the built-in classes read the checkpoint instead (provenance lists the files not "
            f"run: model.remote_code.not_run_sha256)")


def _with_relative_imports(model_dir: Path, files: list[str]) -> list[str]:
    """`files` and every file they import relatively, read as transformers reads them (its regex, nothing run); one
    that is absent or unreadable is named and not followed (its digest then says None, or fails where it is read)."""
    from transformers.dynamic_module_utils import get_relative_imports

    names: set[str] = set()
    todo = list(files)
    while todo:
        name = todo.pop()
        if name in names:
            continue
        names.add(name)
        path = model_dir / name
        try:
            todo += [f"{module}.py" for module in get_relative_imports(str(path))] if path.is_file() else []
        except (OSError, UnicodeDecodeError):
            continue
    return sorted(names)


def remote_code_record(model_dir: Path, trust_remote_code: bool) -> dict[str, Any]:
    """The provenance record: the setting, and the sha256 of each file auto_map points at (with the files they import
    relatively): under `files_sha256` when transformers runs them (the setting on), under `not_run_sha256` when the
    checkpoint declares them and the setting kept them from running (`declared`: which config names which)."""
    model_dir = Path(model_dir)
    declared = auto_map_modules(model_dir)
    referenced = sorted({f for names in declared.values() for f in names})
    files: dict[str, str | None] = {}
    for name in _with_relative_imports(model_dir, referenced):
        path = model_dir / name
        files[name] = sha256_file(path) if path.is_file() else None  # None: named but absent here
    record: dict[str, Any] = {"trust_remote_code": bool(trust_remote_code),
                              "files_sha256": files if trust_remote_code else {}}
    if declared:
        record["declared"] = declared
        record["not_run_sha256"] = {} if trust_remote_code else files
    return record


def load_tokenizer(model_dir: str | Path, trust_remote_code: bool) -> Any:
    """The checkpoint's tokenizer, running its own code only when `trust_remote_code` says so. RemoteCodeError when
    the tokenizer declares its own code, the setting is off and the built-in class cannot read it; when it can, and
    the checkpoint declares code, one warning line names what did not run (each job loads the tokenizer once)."""
    from transformers import AutoTokenizer

    model_dir = Path(model_dir)
    check_remote_code(model_dir, trust_remote_code)
    try:
        # Always a bool: None would make transformers ask on a terminal instead of refusing.
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=bool(trust_remote_code))
    except (ValueError, OSError, TypeError, AttributeError) as e:
        declared = "tokenizer_config.json" in auto_map_modules(model_dir)
        if trust_remote_code or not declared or getattr(e, "errno", None) is not None:  # an I/O error stays one
            raise
        first = (str(e).strip().splitlines() or [""])[0]
        raise RemoteCodeError(f"model.path={str(model_dir)!r}: its tokenizer declares its own code "
                              f"({_declared_text(model_dir, ['tokenizer_config.json'])}), not run since {SETTING} is "
                              f"off, and the built-in tokenizer class cannot read it ({type(e).__name__}: {first}); "
                              f"set {SETTING}=true if you trust that code") from e
    if (line := skipped_code_line(model_dir, trust_remote_code)) is not None:
        log.warning("%s", line)
    return tokenizer
