"""The local executor: one engine in this process (or its worker), every unit in order, finished units skipped."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from pipeline.data.sample import PreparedSample
from pipeline.engines.base import Capture, Engine, EngineInfo, make_engine
from pipeline.run.capture import CaptureStage, StageSettings, UnitResult, finished_unit
from pipeline.run.progress import RunProgress


@dataclass(frozen=True, kw_only=True)
class EngineSpec:
    """How to build the primary engine anywhere (picklable: Ray actors build their own replica from it)."""

    name: str
    kwargs: dict[str, Any]

    def make(self) -> Engine:
        return make_engine(self.name, **self.kwargs)


class LocalExecutor:
    """Executors share this shape: start replicas, report engine info, probe, run units, close."""

    def __init__(self, spec: EngineSpec) -> None:
        self.spec = spec
        self.engine: Engine | None = None

    def __enter__(self) -> "LocalExecutor":
        self.engine = self.spec.make()
        self.engine.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None

    def engine_info(self) -> EngineInfo:
        return self.engine.info()

    def probe(self, samples: Sequence[PreparedSample]) -> list[Capture]:
        """Capture without writing (the diff gate's view of the primary engine)."""
        return self.engine.capture(samples)

    def run(self, settings: StageSettings, run_dir: Path,
            units: Sequence[Sequence[PreparedSample]]) -> list[UnitResult]:
        stage = CaptureStage(engine=self.engine, settings=settings)
        results = []
        with RunProgress(units) as progress:
            for index, unit in enumerate(units):
                result = finished_unit(run_dir, index) or stage.run_unit(run_dir, index, unit)
                progress.unit_done(result, len(unit))
                results.append(result)
        return results
