"""An acceptance report's directory as one kind of output directory (pipeline.core.lifecycle): one measuring process
at a time (an OS lock on the directory itself, released by the kernel when the holder dies), nothing in it but the
report's own files, a finished report (report.json, written last) replaced only with --overwrite, and only once the
new measurement is complete: a measurement that fails leaves the old report as it was."""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from pipeline.core import lifecycle
from pipeline.core.cli import UsageError
from pipeline.core.io import write_text_atomic
from pipeline.core.outdir import Layout, remove
from pipeline.shards.layout import REPORT_HTML, REPORT_JSON, REPORT_MD, check_out

LAYOUT = Layout(kind="acceptance report", files=(REPORT_MD, REPORT_HTML, REPORT_JSON), done=REPORT_JSON)
REPORT_DIR = lifecycle.DirKind(layout=LAYOUT, noun="acceptance report", job="accept", kept=(),
                               is_finished=LAYOUT.is_done, option="--out", overwrite="--overwrite", wait=None,
                               error=UsageError, replace_late=True)
NO_RECORD: dict = {}  # a report has no start record: a rerun measures again


def check(out: Path, *, overwrite: bool) -> None:
    """Read-only, before anything is measured: why `out` cannot take this report (a UsageError), or nothing."""
    check_out(out, f"--out {out}:", UsageError)
    lifecycle.inspect(out, NO_RECORD, overwrite=overwrite, kind=REPORT_DIR)


@contextmanager
def taken(out: Path, *, overwrite: bool) -> Iterator[None]:
    """`out` for this process alone while it measures; a directory this process created is removed again when the
    measurement fails before anything was written."""
    check(out, overwrite=overwrite)
    created = not out.exists()
    try:
        with lifecycle.claim(out, kind=REPORT_DIR):
            # decided again under the lock: what another process finished there while this one waited
            plan = lifecycle.inspect(out, NO_RECORD, overwrite=overwrite, kind=REPORT_DIR)
            lifecycle.prepare(out, NO_RECORD, plan, REPORT_DIR)
            yield
    except BaseException:
        if created and out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        raise


def write(out: Path, *, report_json: str, report_md: str, report_html: str) -> None:
    """The report's files, report.json last: the previous report's report.json goes first, so a write cut short
    never leaves a finished-looking mix of two measurements."""
    LAYOUT.remove_stale_temps(out)
    if LAYOUT.is_done(out):
        remove(out / REPORT_JSON)
    write_text_atomic(out / REPORT_MD, report_md)
    write_text_atomic(out / REPORT_HTML, report_html)
    write_text_atomic(out / REPORT_JSON, report_json)
