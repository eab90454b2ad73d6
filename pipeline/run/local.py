"""The local executor: runs every unit of a stage in this process, one at a time, skipping finished units."""
from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from pipeline.data.sample import PreparedSample
from pipeline.run.capture import CaptureStage, UnitResult

log = logging.getLogger(__name__)


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]capture"), BarColumn(), MofNCompleteColumn(), TextColumn("samples"),
        TextColumn("{task.fields[tok_s]:>8.0f} tok/s"), TimeElapsedColumn(), TextColumn("ETA"),
        TimeRemainingColumn(), console=Console(file=sys.stderr), transient=False,
        disable=not sys.stderr.isatty())


class LocalExecutor:
    def run(self, stage: CaptureStage, run_dir: Path,
            units: Sequence[Sequence[PreparedSample]]) -> list[UnitResult]:
        total_samples = sum(len(u) for u in units)
        total_tokens = sum(s.num_tokens for u in units for s in u)
        results: list[UnitResult] = []
        tokens_done, captured_tokens, capture_seconds = 0, 0, 0.0
        with _progress() as progress:
            task = progress.add_task("capture", total=total_samples, tok_s=0.0)
            for index, unit in enumerate(units):
                unit_tokens = sum(s.num_tokens for s in unit)
                t0 = time.perf_counter()
                result = stage.done(run_dir, index) or stage.run_unit(run_dir, index, unit)
                if not result.skipped:
                    captured_tokens += unit_tokens
                    capture_seconds += time.perf_counter() - t0
                tokens_done += unit_tokens
                results.append(result)
                rate = captured_tokens / capture_seconds if capture_seconds else 0.0
                progress.update(task, advance=len(unit), tok_s=rate)
                eta = (total_tokens - tokens_done) / rate if rate else 0.0
                log.info("unit %d/%d %s: %d samples, %d tokens, %d rejected | %.0f tok/s, ETA %.0fs",
                         index + 1, len(units), "skipped (finished earlier)" if result.skipped else "written",
                         len(unit), unit_tokens, len(result.rejects), rate, eta)
        return results
