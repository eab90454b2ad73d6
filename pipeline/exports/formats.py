"""The trainer layouts by name (`--format`)."""
from __future__ import annotations

from pipeline.exports.base import Exporter
from pipeline.exports.slots import ExportError
from pipeline.exports.specforge import SpecForgeExporter
from pipeline.exports.speculators import SpeculatorsExporter

FORMATS: dict[str, type] = {"speculators": SpeculatorsExporter, "specforge": SpecForgeExporter}


def exporter_for(name: str, storage: str | None = None) -> Exporter:
    """The layout `name`; `storage="fp8"`: speculators' own FP8 layout (no other trainer reads one)."""
    if name not in FORMATS:
        raise ExportError(f"export format {name!r} is unknown; known: {', '.join(FORMATS)}")
    if storage is None:
        return FORMATS[name]()
    if name != "speculators" or storage != "fp8":
        raise ExportError(f"--storage {storage}: only speculators' layout has an fp8 one (--format speculators "
                          "--storage fp8)")
    return SpeculatorsExporter(storage)
