"""The export's provenance sidecar (`export.json`, written last) and the plan file that makes a rerun resume.

`export.json` carries the run's provenance digest and its attestation's digest, the canonical point behind every slot,
and what each slot is in SGLang's and vLLM's numbering for this model (what a draft config must say to be served the
same features).
`.export-plan.json` is written first: a rerun resumes only an export of the same run, layout and slots.
One export writes OUT at a time (`hold`): a second one started beside it would remove the first's temp files.
What OUT holds is the trainer's files (`Exporter.files`) plus these two (`export_layout`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from pipeline.core.claim import DirClaim
from pipeline.core.io import sha256_file, sha256_json
from pipeline.core.jsonfile import read_object
from pipeline.core.outdir import Layout, remove, write_json
from pipeline.exports.slots import ExportError, SlotPlan, TrainerLayout, serving_ids
from pipeline.shards import attestation
from pipeline.shards import layout as shard_layout
from pipeline.shards.storage import of_manifest

SIDECAR = "export.json"
PLAN = ".export-plan.json"
SIDECAR_VERSION = "1"


def export_layout(files: Layout) -> Layout:
    """An export directory: the trainer's `files`, the plan written first and the sidecar written last."""
    return Layout(kind=f"{files.kind} export", files=files.files, dirs=files.dirs, start=PLAN, done=SIDECAR)


def plan_record(run_dir: Path, manifest: Mapping[str, Any], layout: TrainerLayout, plan: SlotPlan) -> dict:
    """What identifies an export: the run (its manifest's bytes and provenance digest), the layout and the slots."""
    return {"format": layout.name, "trainer": layout.trainer,
            "run_manifest_sha256": sha256_file(Path(run_dir) / shard_layout.MANIFEST_NAME),
            "run_provenance_digest": manifest.get("provenance_digest"),
            "slots": [p.label for p in plan.points],
            **({"last_unnormed": True} if plan.last_unnormed else {})}  # absent otherwise: earlier plans unchanged


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
        # the run's attestation (sha256 of the file and of its statement, the keyids that signed it); None: the run
        # has none (format 1 and 2). `python -m pipeline.verify RUN --key PUB` proves the run it names.
        "run_attestation": attestation.record(run_dir),
        "run_dir": str(Path(run_dir).resolve()), "run_points": manifest["points"], "dtype": storage.capture_dtype,
        "hidden_size": manifest["hidden_size"], "num_samples": manifest["num_samples"],
        "num_tokens": manifest["num_tokens"], "model": {"model_type": model_type, "num_layers": num_layers},
        "slots": slots, "last_state": {"point": plan.last.label, "derived": plan.last_unnormed, "how": how,
                                        "why": layout.why_last + ("; divided by that norm's weight, final_norm is read "
                                                                  "back as itself" if plan.last_unnormed else "")},
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
                found = read_object(path, ExportError)  # bounded in size and nesting
            except ExportError as exc:
                raise ExportError(f"{exc}; remove {out} or choose another --out") from None
            got = found.get("plan_sha256") if name == SIDECAR else sha256_json(found)
            if got != want:
                theirs = {k: found.get(k) for k in ("format", "run_provenance_digest", "slots")}
                raise ExportError(f"{out} holds another export ({theirs}); choose another --out")
            return status
    if out.exists() and any(out.iterdir()):
        raise ExportError(f"{out} is not empty and holds no export plan; choose an empty or new --out")
    return "fresh"


def hold(out: Path) -> DirClaim:
    """OUT (created if missing) for this process alone: an OS lock on the directory itself, so no file is added that
    a trainer could list, and the kernel releases it when the holder dies (kill -9 included)."""
    return DirClaim(out, lock_file=None, busy_error=ExportError,
                    refusal=lambda holder: f"{out} is being written by another export; wait for it to finish (a rerun "
                                           f"then finds it complete) or choose another --out")


def claim(out: Path, record: Mapping[str, Any]) -> str:
    """`status`, and for a fresh export the plan file written into `out` (a rerun then resumes it)."""
    found = status(out, record)
    if found == "fresh":
        Path(out).mkdir(parents=True, exist_ok=True)
        write_json(Path(out) / PLAN, record)
    return found


def finish(out: Path, sidecar: Mapping[str, Any]) -> Path:
    """Write export.json (the export is complete from then on) and drop the plan file."""
    path = Path(out) / SIDECAR
    write_json(path, sidecar)
    remove(Path(out) / PLAN)
    return path
