"""The export's provenance sidecar (`export.json`, written last) and the plan file that makes a rerun resume.

`export.json` carries the run's provenance digest, the canonical point behind every slot, and what each slot is in
SGLang's and vLLM's numbering for this model (what a draft config must say to be served the same features).
`.export-plan.json` is written first: a rerun resumes only an export of the same run, layout and slots.
One export writes OUT at a time (`hold`): a second one started beside it would remove the first's temp files.
"""
from __future__ import annotations

import fcntl
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping

from pipeline.core.io import sha256_file, sha256_json, write_text_atomic
from pipeline.exports.slots import ExportError, SlotPlan, TrainerLayout, serving_ids
from pipeline.shards import layout as shard_layout
from pipeline.shards.storage import of_manifest

SIDECAR = "export.json"
PLAN = ".export-plan.json"
SIDECAR_VERSION = "1"


def plan_record(run_dir: Path, manifest: Mapping[str, Any], layout: TrainerLayout, plan: SlotPlan) -> dict:
    """What identifies an export: the run (its manifest's bytes and provenance digest), the layout and the slots."""
    return {"format": layout.name, "trainer": layout.trainer,
            "run_manifest_sha256": sha256_file(Path(run_dir) / shard_layout.MANIFEST_NAME),
            "run_provenance_digest": manifest.get("provenance_digest"),
            "slots": [p.label for p in plan.points]}


def build(run_dir: Path, manifest: Mapping[str, Any], layout: TrainerLayout, plan: SlotPlan,
          record: Mapping[str, Any]) -> dict:
    """The sidecar's content; the driver adds `files` once they are written."""
    model = (manifest.get("provenance") or {}).get("model") or {}
    num_layers, model_type = model.get("num_layers"), model.get("model_type")
    storage = of_manifest(manifest)  # the trainers read the states as the engine captured them
    how = "captured by the run's engine, copied bit-exact" if not storage.scaled else \
        f"captured by the run's engine, stored as {storage.dtype} ({storage.scaling}), dequantized to " \
        f"{storage.capture_dtype}"
    slots = [{"slot": i, "role": "aux" if i < len(plan.aux) else "last", "point": p.label,
              "run_point_index": idx} for i, (p, idx) in enumerate(zip(plan.points, plan.indices))]
    return {
        "sidecar_version": SIDECAR_VERSION, **record, "plan_sha256": sha256_json(record),
        "run_dir": str(Path(run_dir).resolve()), "run_points": manifest["points"], "dtype": storage.capture_dtype,
        "hidden_size": manifest["hidden_size"], "num_samples": manifest["num_samples"],
        "num_tokens": manifest["num_tokens"], "model": {"model_type": model_type, "num_layers": num_layers},
        "slots": slots, "last_state": {"point": plan.last.label, "why": layout.why_last,
                                        "derived": False, "how": how},
        "storage": {**storage.to_dict(), "rounding_rel_l2": (manifest.get("storage") or {}).get("rounding_rel_l2")},
        "serving": serving_ids(plan, model_type=model_type, num_layers=num_layers),
        "pickle": layout.name == "specforge",
    }


def status(out: Path, record: Mapping[str, Any]) -> str:
    """'fresh', 'resume' or 'complete' for this export in `out`, writing nothing; ExportError when `out` holds
    something else."""
    out = Path(out)
    want = sha256_json(record)
    for name, status in ((SIDECAR, "complete"), (PLAN, "resume")):
        path = out / name
        if path.is_file():
            try:
                found = json.loads(path.read_text(encoding="utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise ExportError(f"{path} is not valid JSON ({exc}); remove {out} or choose another --out")
            got = found.get("plan_sha256") if name == SIDECAR else sha256_json(found)
            if got != want:
                theirs = {k: found.get(k) for k in ("format", "run_provenance_digest", "slots")}
                raise ExportError(f"{out} holds another export ({theirs}); choose another --out")
            return status
    if out.exists() and any(out.iterdir()):
        raise ExportError(f"{out} is not empty and holds no export plan; choose an empty or new --out")
    return "fresh"


@contextmanager
def hold(out: Path) -> Iterator[None]:
    """OUT (created if missing) for this process alone: an OS lock on the directory itself, so no file is added that
    a trainer could list, and the kernel releases it when the holder dies (kill -9 included)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ExportError(f"{out} is being written by another export; wait for it to finish (a rerun then "
                              f"finds it complete) or choose another --out") from None
        yield
    finally:
        os.close(fd)


def claim(out: Path, record: Mapping[str, Any]) -> str:
    """`status`, and for a fresh export the plan file written into `out` (a rerun then resumes it)."""
    found = status(out, record)
    if found == "fresh":
        Path(out).mkdir(parents=True, exist_ok=True)
        write_text_atomic(Path(out) / PLAN, json.dumps(record, indent=2, sort_keys=True) + "\n")
    return found


def finish(out: Path, sidecar: Mapping[str, Any]) -> Path:
    """Write export.json (the export is complete from then on) and drop the plan file."""
    path = Path(out) / SIDECAR
    write_text_atomic(path, json.dumps(sidecar, indent=2, sort_keys=True, default=str) + "\n")
    (Path(out) / PLAN).unlink(missing_ok=True)
    return path
