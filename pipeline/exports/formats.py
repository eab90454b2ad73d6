"""The trainer layouts by name (`--format`)."""
from __future__ import annotations

from pipeline.exports.base import Exporter
from pipeline.exports.slots import ExportError
from pipeline.exports.specforge import SpecForgeExporter
from pipeline.exports.speculators import SpeculatorsExporter

FORMATS: dict[str, type] = {"speculators": SpeculatorsExporter, "specforge": SpecForgeExporter}


def exporter_for(name: str) -> Exporter:
    if name not in FORMATS:
        raise ExportError(f"export format {name!r} is unknown; known: {', '.join(FORMATS)}")
    return FORMATS[name]()
