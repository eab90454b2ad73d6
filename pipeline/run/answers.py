"""Extract on a regeneration directory: its samples as prepared data, and who wrote the answers beside who captures
the features, chained into the run's provenance ("answers by X, features by Y") with a warning where they differ."""
from __future__ import annotations

import logging
from typing import Any

from pipeline.data.prepare import PreparedData
from pipeline.data.regenerated import RegeneratedData

log = logging.getLogger(__name__)


def answers_record(data: RegeneratedData) -> dict[str, Any]:
    """What a run records of the regeneration its data came from: the manifest's digest and what wrote the answers."""
    prov = data.manifest["provenance"]
    engine, model = prov["engine"], prov["model"]
    return {
        "manifest_sha256": data.digest,
        "provenance_digest": data.manifest.get("provenance_digest"),
        "engine": {k: engine.get(k) for k in ("framework", "framework_version", "dtype", "attention_backend")}
        | {"quantization": {k: (engine.get("quantization") or {}).get(k) for k in ("method", "kernel")}},
        "model": {k: model.get(k) for k in ("config_sha256", "tokenizer_sha256", "chat_template_sha256")}
        | {"weights_sha256": (model.get("weights") or {}).get("sha256")},
        "sampling": prov["sampling"]["values"], "truncated": data.manifest.get("truncated"),
        "data": prov.get("data"), "code": prov.get("code"),
    }


def answers_of(data: RegeneratedData) -> PreparedData:
    return PreparedData(source=data.source, source_digest=data.digest, loss_mask=data.loss_mask,
                        samples=data.samples, rejects=data.rejects, regeneration=answers_record(data))


def check_answers(regeneration: dict[str, Any] | None, digests: dict[str, Any], model_path: Any) -> str | None:
    """The warning for answers another checkpoint wrote (logged), or None."""
    if not regeneration:
        return None
    model = regeneration["model"]
    if model["weights_sha256"] == digests["weights"]["sha256"] and model["config_sha256"] == digests["config_sha256"]:
        return None
    warning = (f"answers by another model: the regeneration was written by a checkpoint whose weights or config "
               f"differ from model.path={str(model_path)!r}; a drafter learns to predict the model that wrote its "
               f"answers")
    log.warning("%s", warning)
    return warning


def answers_line(regeneration: dict[str, Any] | None, engine: Any) -> str | None:
    """`answers by sglang 0.5.23 (bfloat16), features by vllm 0.32.0 (float32)`, or None without a regeneration."""
    if not regeneration:
        return None
    a = regeneration["engine"]
    return (f"answers by {a['framework']} {a['framework_version']} ({a['dtype']}), features by {engine.framework} "
            f"{engine.framework_version} ({engine.dtype})")
