"""The local executor: one engine in this process (or its worker), every unit in order."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

from pipeline.core.contracts import Capture, EngineInfo, PreparedSample
from pipeline.engines.base import Engine, EngineStartError, error_summary
from pipeline.run.contract import StagePlan, UnitResult, run_units
from pipeline.run.executor import Executor, OnDone

log = logging.getLogger(__name__)


class LocalExecutor(Executor):
    engine: Engine | None = None

    def __enter__(self) -> "LocalExecutor":
        self.engine = self.make_engine()
        try:
            self.engine.start()
        except Exception as e:
            self.engine.close()  # a worker process that did start is not left behind
            self.engine = None
            raise EngineStartError(f"engine={self.spec.name} did not start: {error_summary(e)}") from e
        return self

    def __exit__(self, *exc: object) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None

    def info(self) -> EngineInfo:
        return self.engine.info()

    def capture(self, samples: Sequence[PreparedSample]) -> list[Capture]:
        return self.engine.capture(samples)

    def _run_units(self, settings: StagePlan, run_dir: Path, units: Sequence[Sequence[object]],
                   todo: list[int], done: OnDone) -> dict[int, str]:
        stage = settings.stage(self.engine)
        finished: set[int] = set()

        def finish(result: UnitResult) -> None:
            finished.add(result.index)
            done(result)

        try:
            run_units(stage, run_dir, [(index, units[index]) for index in todo], finish,
                      overlap=settings.overlap_writes)
        except RuntimeError as e:  # the engine's failure (a worker gone, a capture that does not add up): the unit's
            log.debug("unit failed", exc_info=e)
            return {min(set(todo) - finished): error_summary(e)}
        return {}
