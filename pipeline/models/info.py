"""What a checkpoint directory says about its model, read from config.json without loading any weights."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.jsonfile import Fields, read_fields
from pipeline.points import family_of


@dataclass(frozen=True, kw_only=True)
class ModelInfo:
    path: Path
    model_type: str
    architecture: str
    family: str  # the capture-numbering family ("llama", "deepseek")
    num_layers: int
    hidden_size: int
    torch_dtype: str
    quantization: dict[str, Any] | None
    vocab_size: int | None = None  # the embedding table's rows: every token id is below it


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The text model's part of a parsed config.json: a multimodal wrapper (Kimi-K2.5) nests it under `text_config`,
    any other checkpoint is its own text model. Every module that reads a checkpoint's layers, width or vocabulary
    reads them from here: the captured stream is the text model's."""
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) and inner else config


def read_model_info(path: str | Path) -> ModelInfo:
    path = Path(path)
    config_file = path / "config.json"
    if not path.is_dir():
        raise FileNotFoundError(f"model.path={str(path)!r}: no such directory")
    if not config_file.is_file():
        raise FileNotFoundError(f"model.path={str(path)!r}: no config.json in it (not a checkpoint directory)")
    fields = read_fields(config_file, ValueError, prefix=f"model.path={str(path)!r}: ")  # bounded, typed
    config = fields.value
    text = text_config(config)
    missing = [k for k in ("model_type", "num_hidden_layers", "hidden_size") if k not in text]
    if missing:
        raise ValueError(f"model.path={str(path)!r}: config.json lacks {missing}")
    typed = Fields(text, file=fields.file, error=ValueError, at="" if text is config else "text_config")
    quantization = fields.obj("quantization_config", optional=True)
    if quantization is None or not quantization.value:
        quantization = typed.obj("quantization_config", optional=True)
    return ModelInfo(
        path=path,
        model_type=typed.str("model_type"),
        architecture=(fields.list("architectures", "str", optional=True) or ["?"])[0],
        family=family_of(text["model_type"]),
        num_layers=typed.int("num_hidden_layers", minimum=1),
        hidden_size=typed.int("hidden_size", minimum=1),
        torch_dtype=str(text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or "float32"),
        quantization=dict(quantization.value) if quantization is not None and quantization.value else None,
        vocab_size=typed.int("vocab_size", optional=True, minimum=1),
    )
