"""Extract on a regeneration directory: who wrote the answers beside who captures the features ("answers by X,
features by Y"), with a warning where the answers are another checkpoint's or another engine's."""
from __future__ import annotations

import logging
from typing import Any


log = logging.getLogger(__name__)


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
