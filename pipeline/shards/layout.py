"""The run directory's layout, and the names, paths and dtypes of its shard format: shared by the writer, the reader
and the verifier."""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
import torch

from pipeline.core.outdir import Layout, unusable_dir
from pipeline.core.storage import not_local
from pipeline.data.regeneration import is_regeneration

FORMAT_VERSION = "3"  # what the writer writes; pipeline.shards.formats reads every version
SHARDS_DIR = "shards"
MANIFEST_NAME = "manifest.json"
DIFF_DIR = "diff"  # the diff gate's report, written before the run starts (pipeline.run.gate)
RUN_FILE = "run.json"  # written when a run starts; a rerun resumes only a run of the same config
ATTESTATION_NAME = "attestation.intoto.json"  # every file's sha256 and the provenance, written just before the manifest
LOCK_NAME = ".lock"  # the out_dir lock and its lease (pipeline.core.claim)
PREPARE_REJECTS = "rejects.parquet"  # records rejected by data preparation
REJECTS_DIR = "rejects"  # samples rejected at capture, one file per unit
SHARD_SUFFIXES = {"safetensors": ".safetensors", "parquet": ".parquet", "marker": ".done.json"}

# A diff report's files (pipeline.compare.report): in a run's diff/ folder, or in pipeline.diff's out_dir.
REPORT_JSON, REPORT_MD, REPORT_HTML = "report.json", "report.md", "report.html"
REPORT = Layout(kind="diff report", files=(REPORT_JSON, REPORT_MD, REPORT_HTML))
_SHARD = r"shard-\d{5,}"  # shard_name
SHARD_NAME = re.compile(_SHARD)
# Every name a run writes; their temp files are `.<name>.<random>.tmp` beside them.
RUN = Layout(
    kind="run",
    files=(MANIFEST_NAME, RUN_FILE, LOCK_NAME, PREPARE_REJECTS, ATTESTATION_NAME),
    dirs={SHARDS_DIR: tuple(_SHARD + re.escape(s) for s in SHARD_SUFFIXES.values()),
          REJECTS_DIR: (_SHARD + r"\.parquet",),  # the capture rejects of one unit
          DIFF_DIR: tuple(map(re.escape, REPORT.files))},
    lock=LOCK_NAME, start=RUN_FILE, done=MANIFEST_NAME,
)


def run_conflict(path: Path, *, itself: bool = False) -> str | None:
    """Why nothing may be written at `path` ("is inside the run directory R: ..."), or None: the nearest directory
    above `path` (or `path` itself, with `itself`) holding a run (run.json or manifest.json) or a regeneration
    (regen.json, or its manifest). Anything but a run's own
    files in a run directory is a file its verification names as not the run's, so that run would no longer verify
    (and exports refuse such a run)."""
    path = Path(path).resolve()
    for parent in ([path] if itself else []) + list(path.parents):
        if (parent / RUN_FILE).is_file() or (parent / MANIFEST_NAME).is_file():
            noun = "regeneration" if is_regeneration(parent) else "run"
            where = f"is a {noun} directory" if parent == path else f"is inside the {noun} directory {parent}"
            return f"{where}: anything written there would make that {noun} fail verification; choose a " \
                   f"directory outside it"
        if is_regeneration(parent):
            where = "is a regeneration directory" if parent == path else f"is inside the regeneration directory {parent}"
            return f"{where}: anything written there would make that regeneration fail verification; choose a " \
                   f"directory outside it"
    return None

def check_out(out: Path, name: str, error: type[Exception], *, itself: bool = True, note: str = "",
              writable: bool = True) -> Path:
    """The output-directory pre-check every job runs before it reads or starts anything: `out` is neither a run or
    regeneration directory (with `itself`; a job deciding its own kind's directory passes False and leaves it to
    pipeline.core.lifecycle) nor inside one, and is a directory (or can become one) this process can write. `error`
    names it as `name` ("out_dir='/data/r1'", "--out /data/x"), `note` follows the first refusal; `writable`
    False leaves the write probe to a later `unusable_dir` (an export already complete needs no write)."""
    if (why := not_local(out) or run_conflict(out, itself=itself)) is not None:
        raise error(f"{name} {why}{note}")
    if Path(out).exists() and not Path(out).is_dir():
        raise error(f"{name} exists and is not a directory")
    if writable and (why := unusable_dir(out)) is not None:
        raise error(f"{name} {why}")
    return Path(out)


# Tensor names inside a shard's .safetensors file, in the order they are laid out: 8-byte types first so every tensor
# starts on its natural alignment for zero-copy readers. fp8 storage adds HIDDEN_SCALES [T, P] float32 right after
# HIDDEN_STATES (pipeline/shards/storage.py; 4-byte aligned whenever T*P*H is a multiple of 4, as it is for every
# hidden size a model has; the safetensors library copies a misaligned slice rather than failing).
INPUT_IDS = "input_ids"
SAMPLE_OFFSETS = "sample_offsets"
HIDDEN_STATES = "hidden_states"
HIDDEN_SCALES = "hidden_scales"
LOSS_MASK = "loss_mask"
TENSOR_NAMES = (INPUT_IDS, SAMPLE_OFFSETS, HIDDEN_STATES, LOSS_MASK)  # hidden states stored as captured

# Safetensors metadata keys the writer owns; caller metadata may not override them.
META_POINTS = "points"
META_FORMAT_VERSION = "format_version"
META_STORAGE = "storage"  # {"dtype", "capture_dtype", "scaling"} as JSON (pipeline/shards/storage.py)
RESERVED_METADATA = (META_POINTS, META_FORMAT_VERSION, META_STORAGE)

PARQUET_COLUMNS = ("sample_id", "source", "row", "offset", "num_tokens", "num_loss_tokens", "truncated",
                   "token_digest")

# dtype name (as in the manifest) -> (torch dtype, safetensors dtype code)
HIDDEN_DTYPES: dict[str, tuple[torch.dtype, str]] = {
    "float32": (torch.float32, "F32"),
    "float16": (torch.float16, "F16"),
    "bfloat16": (torch.bfloat16, "BF16"),
    "float8_e4m3fn": (torch.float8_e4m3fn, "F8_E4M3"),
}
INDEX_DTYPES: dict[str, tuple[torch.dtype, str]] = {
    INPUT_IDS: (torch.int64, "I64"),
    SAMPLE_OFFSETS: (torch.int64, "I64"),
    LOSS_MASK: (torch.uint8, "U8"),
}


def shard_name(index: int) -> str:
    if index < 0:
        raise ValueError(f"shard index={index} must be >= 0")
    return f"shard-{index:05d}"


def shard_paths(run_dir: Path, index: int) -> dict[str, Path]:
    """The three files of shard `index`: safetensors, parquet and the completion marker (written last)."""
    base = Path(run_dir) / SHARDS_DIR / shard_name(index)
    return {kind: base.with_suffix(suffix) for kind, suffix in SHARD_SUFFIXES.items()}


def rejects_path(run_dir: Path, index: int) -> Path:
    """The capture rejects of unit `index` (written beside its shard, also when every sample was rejected)."""
    return Path(run_dir) / REJECTS_DIR / f"{shard_name(index)}.parquet"


def dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in HIDDEN_DTYPES:
        raise ValueError(f"hidden state dtype={name} is not storable; supported: {', '.join(HIDDEN_DTYPES)}")
    return name


def ids_digest(input_ids_T: np.ndarray) -> str:
    """Format versions 1 and 2's `token_digest`: sha256 of the token ids as little-endian int64 bytes (independent of
    the array's own dtype). It leaves out the loss mask and where the sample lies."""
    return hashlib.sha256(np.ascontiguousarray(input_ids_T, dtype="<i8").tobytes()).hexdigest()


_TOKEN_DIGEST_TAG = b"pipeline token_digest v3\n"


def token_digest(input_ids_T: np.ndarray, loss_mask_T: np.ndarray, offset: int) -> str:
    """A sample's `token_digest` (format version 3): sha256 of a tag, the sample's offset in its shard and its number
    of tokens T (little-endian int64), its token ids (T little-endian int64) and its loss mask (T bytes, 0 or 1). It
    covers everything a Parquet row says about the sample's tokens, so one moved loss-mask token, a changed id or a
    row pointing at another sample's rows changes it."""
    ids = np.ascontiguousarray(input_ids_T, dtype="<i8")
    mask = np.ascontiguousarray(loss_mask_T, dtype=np.uint8)
    if ids.shape != mask.shape or ids.ndim != 1:
        raise ValueError(f"token_digest: input_ids {ids.shape} and loss_mask {mask.shape} must be one [T] each")
    digest = hashlib.sha256(_TOKEN_DIGEST_TAG)
    digest.update(np.array([offset, ids.size], dtype="<i8").tobytes())
    digest.update(ids.tobytes())
    digest.update(mask.tobytes())
    return digest.hexdigest()
