"""Remote code in a checkpoint directory: which Python files its configs point at, whether loading it needs them, and
their digests.

A checkpoint's `config.json` and `tokenizer_config.json` may name classes in its own .py files (`auto_map`), which
transformers imports, that is runs, when asked to with `trust_remote_code`. The pipeline never does so silently:
`model.trust_remote_code` must say so, and provenance records the setting and the sha256 of every such file.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.core.io import sha256_file

SETTING = "model.trust_remote_code"
# The configs whose auto_map the data layer and the engines follow (the processor's is never loaded: text only).
CONFIG_FILES = {"config.json": "AutoConfig", "tokenizer_config.json": "AutoTokenizer"}


class RemoteCodeError(ValueError):
    """A checkpoint that cannot load without running its own code, while model.trust_remote_code is off."""


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


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


def _needed_by(model_dir: Path) -> list[str]:
    """What cannot load without the checkpoint's own code: a tokenizer or config class transformers does not have."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    model_dir = Path(model_dir)
    needed = []
    tokenizer = _read_json(model_dir / "tokenizer_config.json")
    tokenizer_class = tokenizer.get("tokenizer_class")
    if "AutoTokenizer" in (tokenizer.get("auto_map") or {}) and (
            not tokenizer_class or tokenizer_class_from_name(tokenizer_class) is None):
        needed.append("tokenizer_config.json")
    config = _read_json(model_dir / "config.json")
    if "AutoConfig" in (config.get("auto_map") or {}) and config.get("model_type") not in CONFIG_MAPPING:
        needed.append("config.json")
    return needed


def check_remote_code(model_dir: Path, trust_remote_code: bool) -> None:
    """Raise RemoteCodeError (one line, naming the setting) when the checkpoint needs its own code, which it may not
    run."""
    if trust_remote_code:
        return
    needed = _needed_by(Path(model_dir))
    if needed:
        modules = auto_map_modules(Path(model_dir))
        what = "; ".join(f"{name} auto_map -> {', '.join(modules.get(name, []))}" for name in needed)
        raise RemoteCodeError(f"model.path={str(model_dir)!r} loads only by running its own Python code ({what}); "
                              f"set {SETTING}=true if you trust that code")


def _with_relative_imports(model_dir: Path, files: list[str]) -> list[str]:
    from transformers.dynamic_module_utils import get_relative_import_files

    names = set()
    for name in files:
        path = model_dir / name
        names.add(name)
        if path.is_file():
            names.update(Path(p).name for p in get_relative_import_files(str(path)))
    return sorted(names)


def remote_code_record(model_dir: Path, trust_remote_code: bool) -> dict[str, Any]:
    """The provenance record: the setting, and the sha256 of each file auto_map points at (with the files they import
    relatively), which transformers runs under it. With the setting off nothing of the checkpoint's runs: no files."""
    model_dir = Path(model_dir)
    files: dict[str, str | None] = {}
    if trust_remote_code:
        referenced = sorted({f for names in auto_map_modules(model_dir).values() for f in names})
        for name in _with_relative_imports(model_dir, referenced):
            path = model_dir / name
            files[name] = sha256_file(path) if path.is_file() else None  # None: named but absent here
    return {"trust_remote_code": bool(trust_remote_code), "files_sha256": files}


def load_tokenizer(model_dir: str | Path, trust_remote_code: bool) -> Any:
    """The checkpoint's tokenizer, running its own code only when `trust_remote_code` says so."""
    from transformers import AutoTokenizer

    check_remote_code(Path(model_dir), trust_remote_code)
    # Always a bool: None would make transformers ask on a terminal instead of refusing.
    return AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=bool(trust_remote_code))
