"""The configured executor for a job (extract's capture, regenerate's generation): constructing it loads nothing, but
an engine whose adapter or environment is absent (or runner=ray without Ray) fails here, before anything starts."""
from __future__ import annotations

from typing import Any, Sequence

from pipeline.core.cli import ConfigError
from pipeline.core.contracts import EngineSpec
from pipeline.engines.base import Task
from pipeline.points import Point
from pipeline.run.executor import Executor
from pipeline.run.local import LocalExecutor
from pipeline.run.ray import RayExecutor


def executor_for(runner: Any, spec: EngineSpec, *, model_path: str, points: Sequence[Point], num_layers: int,
                 trust_remote_code: bool, task: Task = "capture") -> Executor:
    """`runner.name` ray: one actor per replica; else this process (or the engine's worker)."""
    where = dict(model_path=model_path, points=list(points), num_layers=num_layers,
                 trust_remote_code=trust_remote_code, task=task)
    try:
        if runner.name == "ray":
            return RayExecutor(runner, spec=spec, **where)
        return LocalExecutor(spec, **where)
    except FileNotFoundError as e:
        raise ConfigError(str(e)) from e
