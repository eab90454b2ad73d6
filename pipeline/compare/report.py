"""Writing a diff report: report.json (machine), report.md (people) and report.html (people, with plots)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.compare.analyze import DiffResult
from pipeline.compare.html import write_html
from pipeline.compare.markdown import to_markdown
from pipeline.compare.serialize import to_dict
from pipeline.core.io import write_text_atomic
from pipeline.shards.layout import REPORT, REPORT_JSON, REPORT_MD


def write_report(result: DiffResult, out_dir: Path, *, config: dict[str, Any], html: bool) -> Path:
    """report.json, report.md and (html=True) report.html in out_dir; stale files of an earlier report go first."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in REPORT.files:
        (out_dir / name).unlink(missing_ok=True)
    data = to_dict(result, config=config)
    write_text_atomic(out_dir / REPORT_JSON, json.dumps(data, indent=1, allow_nan=False) + "\n")
    write_text_atomic(out_dir / REPORT_MD, to_markdown(result))
    if html:
        write_html(result, out_dir)
    return out_dir
