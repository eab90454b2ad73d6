"""The export's provenance sidecar (`export.json`, written last) and the plan file that makes a rerun resume.

`export.json` carries the run's provenance digest and its attestation's digest, the canonical point behind every slot,
and what each slot is in SGLang's and vLLM's numbering for this model (what a draft config must say to be served the
same features).
`.export-plan.json` is written first: a rerun resumes only an export of the same run, layout and slots.
One export writes OUT at a time (the lifecycle's claim): a second one started beside it would remove the first's temp
files. What OUT holds is the trainer's files (`Exporter.files`) plus these two (`export_layout`, `export_dir`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from pipeline.core.io import sha256_json
from pipeline.core.lifecycle import DirKind
from pipeline.core.outdir import Layout, remove, write_json
from pipeline.exports.slots import ExportError, SlotPlan, TrainerLayout, serving_ids
from pipeline.shards.run_at import RunAt
from pipeline.shards.storage import of_manifest

SIDECAR = "export.json"
PLAN = ".export-plan.json"
SIDECAR_VERSION = "2"  # 2: run_attestation.claimed_keyids (1: signed_by, the same unchecked keyids)
PLAN_KEYS = ("format", "trainer", "run_manifest_sha256", "run_provenance_digest", "slots", "last_unnormed",
             "draft_vocab", "states", "export_storage")  # what `plan_record` may hold, optional ones last


def export_layout(files: Layout, lease: str | None = None) -> Layout:
    """An export directory: the trainer's `files`, the plan written first and the sidecar written last (on a store,
    the lease object too: pipeline.exports.target)."""
    return Layout(kind=f"{files.kind} export", files=files.files, dirs=files.dirs, lock=lease, start=PLAN,
                  done=SIDECAR)


def plan_record(run: RunAt, manifest: Mapping[str, Any], layout: TrainerLayout, plan: SlotPlan) -> dict:
    """What identifies an export: the run (its manifest's bytes and provenance digest), the layout and the slots."""
    return {"format": layout.name, "trainer": layout.trainer,
            "run_manifest_sha256": run.manifest_sha256(),
            "run_provenance_digest": manifest.get("provenance_digest"),
            "slots": [p.label for p in plan.points],
            **({"last_unnormed": True} if plan.last_unnormed else {})}  # absent otherwise: earlier plans unchanged


def build(run: RunAt, manifest: Mapping[str, Any], layout: TrainerLayout, plan: SlotPlan,
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
        # the run's attestation (sha256 of the file and of its statement, the keyids its signatures claim, unchecked);
        # None: the run has none (format 1 and 2). `python -m pipeline.verify RUN --key PUB` proves the run it names.
        "run_attestation": run.attestation(),
        "run_dir": run.name, "run_points": manifest["points"], "dtype": storage.capture_dtype,  # run_dir: or s3://
        "hidden_size": manifest["hidden_size"], "num_samples": manifest["num_samples"],
        "num_tokens": manifest["num_tokens"], "model": {"model_type": model_type, "num_layers": num_layers},
        "slots": slots, "last_state": {"point": plan.last.label, "derived": plan.last_unnormed, "how": how,
                                        "why": layout.why_last + ("; divided by that norm's weight, final_norm is read "
                                                                  "back as itself" if plan.last_unnormed else "")},
        "storage": {**storage.to_dict(), "rounding_rel_l2": (manifest.get("storage") or {}).get("rounding_rel_l2")},
        "serving": serving_ids(plan, model_type=model_type, num_layers=num_layers),
        "pickle": layout.name == "specforge",
    }


def _plan_v1(sidecar: Mapping[str, Any]) -> dict:
    """Version 1: the plan's keys at the top level, its `slots` (labels) replaced there by the slots' records, and
    `last_unnormed`, `draft_vocab` present only when set (so `plan_sha256` is over exactly the keys present)."""
    plan = {k: sidecar[k] for k in PLAN_KEYS if k in sidecar}
    if "draft_vocab" in plan:  # the plan's N, replaced by the vocabulary's record once written
        written = plan["draft_vocab"]
        plan["draft_vocab"] = written.get("draft_vocab_size") if isinstance(written, dict) else written
    slots = sidecar.get("slots")
    if isinstance(slots, list):
        plan["slots"] = [s.get("point") if isinstance(s, dict) else s for s in slots]
    return plan


# One reader per sidecar version: an export written by any of them is found complete. Version 2 renamed only
# run_attestation's `signed_by` (keyids nobody had checked) to `claimed_keyids`; its plan reads as version 1's.
PLAN_READERS = {"1": _plan_v1, "2": _plan_v1}


def _finished_record(found: dict, where: str) -> dict:
    """The plan a finished export was written for, as its sidecar (`found`, read from `where`) records it; {}
    (another export's) when the sidecar does not prove it (`plan_sha256`). ExportError: a sidecar this code cannot
    read."""
    version = found.get("sidecar_version")
    if version not in PLAN_READERS:
        raise ExportError(f"{where}: sidecar_version {version!r}, which this code does not read "
                          f"(it reads {', '.join(PLAN_READERS)})")
    plan = PLAN_READERS[version](found)
    return plan if sha256_json(plan) == found.get("plan_sha256") else {}


def export_dir(files: Layout, lease: str | None = None) -> DirKind:
    """An export directory as one kind of output directory (pipeline.core.lifecycle): the export command writes it,
    a rerun of the same plan finds a finished one complete, it is never replaced (choose another --out), and on disk
    it is locked itself (no lock file a trainer could list)."""
    layout = export_layout(files, lease)
    return DirKind(layout=layout, noun="export", job="export", kept=(lease,) if lease else (),
                   is_finished=layout.is_done, option="--out", overwrite=None, wait=None, error=ExportError,
                   finished_record=_finished_record)


def finish(out: Path, sidecar: Mapping[str, Any]) -> Path:
    """Write export.json (the export is complete from then on) and drop the plan file."""
    path = Path(out) / SIDECAR
    write_json(path, sidecar)
    remove(Path(out) / PLAN)
    return path
