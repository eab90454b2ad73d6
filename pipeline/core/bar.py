"""The one live progress bar every stage shows: on stderr, drawn only on a terminal (logs get a line per unit)."""
from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


def live_bar(title: str, *rates: str) -> Progress:
    """`title` [bar] done/total samples, then each rate column (a rich format string of the task's fields, e.g.
    "{task.fields[tok_s]:>8.0f} tok/s"), elapsed and ETA."""
    return Progress(TextColumn(f"[bold]{title}"), BarColumn(), MofNCompleteColumn(), TextColumn("samples"),
                    *map(TextColumn, rates), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                    console=Console(file=sys.stderr), disable=not sys.stderr.isatty())
