"""A checkpoint's text config is read in one place, `pipeline.models.info.text_config`, for a multimodal wrapper
(Kimi-K2.5 nests it under text_config) and for a plain text model alike."""
from __future__ import annotations

import ast
import json
from pathlib import Path

from pipeline.models.info import read_model_info, text_config
from tests.helpers import REPO

TEXT = {"model_type": "kimi_k2", "num_hidden_layers": 61, "hidden_size": 7168, "torch_dtype": "bfloat16"}
WRAPPER = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25", "text_config": TEXT,
           "vision_config": {"vt_hidden_size": 1152}}
PLAIN = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "num_hidden_layers": 3,
         "hidden_size": 64}


def test_the_text_config_of_a_wrapper_and_of_a_plain_checkpoint(tmp_path):
    assert text_config(WRAPPER) is TEXT and text_config(PLAIN) is PLAIN
    assert text_config({**PLAIN, "text_config": None}) == {**PLAIN, "text_config": None}
    (tmp_path / "config.json").write_text(json.dumps(WRAPPER))
    info = read_model_info(tmp_path)
    assert (info.model_type, info.architecture, info.num_layers, info.hidden_size) == (
        "kimi_k2", "KimiK25ForConditionalGeneration", 61, 7168)


def _reads_text_config(path: Path) -> list[int]:
    """Lines where `path` reads the key itself: config.get("text_config") or config["text_config"]."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        key = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and node.args:
            key = node.args[0]
        elif isinstance(node, ast.Subscript):
            key = node.slice
        if isinstance(key, ast.Constant) and key.value == "text_config":
            lines.append(node.lineno)
    return lines


def test_no_other_module_reads_the_text_config_itself():
    files = [p for root in ("pipeline", "bench") for p in (REPO / root).rglob("*.py")]
    readers = {p.relative_to(REPO).as_posix(): lines for p in files if (lines := _reads_text_config(p))}
    assert list(readers) == ["pipeline/models/info.py"], readers
