"""The local executor: one engine in this process (or its worker), every unit in order, finished units skipped."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

from pipeline.data.sample import PreparedSample
from pipeline.engines.base import Capture, Engine, EngineInfo, EngineStartError, error_summary, make_engine
from pipeline.run.capture import CaptureStage, StageSettings, UnitResult, run_units, unfinished_units
from pipeline.run.progress import RunProgress

T = TypeVar("T")


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

    def run_beside(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run `fn` where a replica runs (the gate's other engines need what a replica has); here: in place."""
        return fn(*args, **kwargs)

    def engine_info(self) -> EngineInfo:
        return self.engine.info()

    def probe(self, samples: Sequence[PreparedSample]) -> list[Capture]:
        """Capture without writing (the diff gate's view of the primary engine)."""
        return self.engine.capture(samples)

    def run(self, settings: StageSettings, run_dir: Path,
            units: Sequence[Sequence[PreparedSample]]) -> list[UnitResult]:
        stage = CaptureStage(engine=self.engine, settings=settings)
        results: dict[int, UnitResult] = {}
        with RunProgress(units) as progress:
            def done(result: UnitResult) -> None:
                results[result.index] = result
                progress.unit_done(result)

            todo = [(index, units[index]) for index in unfinished_units(run_dir, len(units), done)]
            run_units(stage, run_dir, todo, done, overlap=settings.overlap_writes)
        return [results[i] for i in range(len(units))]
