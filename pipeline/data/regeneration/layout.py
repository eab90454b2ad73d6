"""A regeneration directory's layout (written by `python -m pipeline.regenerate`): its names, its records' Parquet
schema, the lifecycle kind it is (pipeline.core.lifecycle), its manifest and its conversations in input order."""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.core import jsonfile
from pipeline.core.io import sha256_file
from pipeline.core.lifecycle import DirKind
from pipeline.core.outdir import Layout

REGEN_FORMAT_VERSION = "1"
START_FILE = "regen.json"  # written when a regeneration starts; a rerun resumes only the same regeneration
MANIFEST = "manifest.json"  # written last: the directory is complete
LOCK = ".lock"
REJECTS = "rejects.parquet"  # records that could not be regenerated (unreadable, too long, ...)
RECORDS_DIR = "records"
_PART = r"part-\d{5,}"
LAYOUT = Layout(kind="regeneration", files=(START_FILE, MANIFEST, LOCK, REJECTS),
                dirs={RECORDS_DIR: (_PART + r"\.parquet", _PART + r"\.done\.json", _PART + r"\.rejects\.parquet")},
                lock=LOCK, start=START_FILE, done=MANIFEST)
KIND = "regeneration"  # the manifest's `kind`: how extract tells a regeneration directory from a run


def _finished(root: Path) -> bool:
    try:
        read_manifest(root)
    except (ValueError, OSError):
        return False
    return True


# The regeneration directory as one kind of output directory (pipeline.core.lifecycle): regenerate writes it.
REGEN_DIR = DirKind(layout=LAYOUT, noun="regeneration", job="regenerate", kept=(LOCK,), is_finished=_finished)

TURN = pa.struct([
    ("turn", pa.int32()),  # 0-based index among the conversation's regenerated turns
    ("messages", pa.string()),  # JSON: the conversation the prompt renders (earlier answers: the target's own)
    ("prompt_ids", pa.list_(pa.int64())),
    ("output_ids", pa.list_(pa.int64())),
    ("finish_reason", pa.string()),  # stop | length
    ("seed", pa.int64()),
    ("applied", pa.string()),  # JSON: the sampling values the engine applied, its defaults included
    ("text", pa.string()),  # the answer decoded, for review only (extract reads the ids)
])
SCHEMA = pa.schema([
    ("conversation_id", pa.string()),  # stable: the record id and the sample index
    ("record_id", pa.string()),  # the input record's sample id (its file's digest and row)
    ("source", pa.string()),
    ("row", pa.int64()),
    ("sample", pa.int32()),  # 0..n-1: the n samples of one prompt
    ("tools", pa.string()),  # JSON or null: the tools the record declares
    ("turns", pa.list_(TURN)),
    ("end_reason", pa.string()),  # complete | truncated | tool_call_mismatch | unexpected_tool_call | too_long
    ("end_detail", pa.string()),
])


def part_name(index: int) -> str:
    return f"part-{index:05d}"


def part_paths(root: Path, index: int) -> dict[str, Path]:
    base = Path(root) / RECORDS_DIR / part_name(index)
    return {"parquet": base.with_suffix(".parquet"), "marker": base.with_suffix(".done.json"),
            "rejects": base.with_suffix(".rejects.parquet")}


def conversation_id(record_id: str, sample: int) -> str:
    return hashlib.sha256(f"{record_id}:{sample}".encode()).hexdigest()[:16]


def is_regeneration(path: Path) -> bool:
    """A directory holding a regeneration's start record or manifest."""
    path = Path(path)
    return path.is_dir() and ((path / START_FILE).is_file() or
                              (jsonfile.read_lenient(path / MANIFEST) or {}).get("kind") == KIND)


def read_manifest(root: Path, error: type[Exception] = ValueError) -> dict[str, Any]:
    """The finished regeneration's manifest; `error` when there is none (an unfinished one names what to do)."""
    root = Path(root)
    if not (root / MANIFEST).is_file():
        raise error(f"{root} is an unfinished regeneration (no {MANIFEST}): rerun the same pipeline.regenerate "
                    f"command to finish it")
    manifest = jsonfile.read_object(root / MANIFEST, error)
    if manifest.get("kind") != KIND:
        raise error(f"{root / MANIFEST} is not a regeneration's manifest (kind {manifest.get('kind')!r})")
    _check_fields(jsonfile.Fields(manifest, file=str(root / MANIFEST), error=error))
    return manifest


def _check_fields(m: jsonfile.Fields) -> None:
    """Every field a reader or verify uses, typed: a wrong one is `error` naming the file and the field's path (as a
    run's manifest's is), never a traceback."""
    for key in ("num_records", "num_conversations", "num_turns", "prompt_tokens", "generated_tokens"):
        m.int(key, minimum=0)
    m.obj("end_reasons")
    truncated = m.obj("truncated")
    truncated.int("turns", minimum=0)
    truncated.int("kept", minimum=0)
    truncated.str("policy")
    m.obj("rejects").int("total", minimum=0)
    for index, part in enumerate(m.objects("parts")):
        expected = f"{RECORDS_DIR}/{part_name(index)}.parquet"
        if part.str("file") != expected:  # never a path outside the directory (/dev/zero, ../x)
            raise part.fail("file", f"must be {expected!r}, got {part.value['file']!r}")
        part.str("sha256")
        part.int("bytes", minimum=0)
        part.int("conversations", minimum=0)
    prov = m.obj("provenance")
    for key in ("framework", "framework_version", "dtype"):
        prov.obj("engine").str(key)
    prov.obj("model").int("vocab_size", optional=True, minimum=1)
    prov.obj("data").str("sha256")
    sampling = prov.obj("sampling")
    sampling.obj("values").int("max_tokens", minimum=1)
    sampling.int("n", minimum=1)
    sampling.obj("stop_token_ids").list("ids", "int")
    prov.obj("config").obj("data").int("max_length", minimum=1)


def manifest_digest(root: Path) -> str:
    """sha256 of the manifest's bytes: it lists every part's sha256, so it names the regenerated data."""
    return sha256_file(Path(root) / MANIFEST)


def iter_conversations(root: Path, manifest: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every conversation row, in input order (parts in order, rows in order), each part's sha256 checked first."""
    for part in manifest["parts"]:
        path = Path(root) / part["file"]
        if path.is_symlink() or not path.is_file() or path.stat().st_size != part["bytes"] \
                or sha256_file(path) != part["sha256"]:  # streamed: a part is never read whole to be hashed
            raise ValueError(f"{path}: not the part the regeneration's manifest lists (missing, or another size or "
                             f"sha256: the file changed after it was written); rerun pipeline.regenerate on a fresh "
                             f"directory or restore the file")
        yield from pq.read_table(path).to_pylist()
