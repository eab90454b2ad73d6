"""An acceptance report's directory, through the machinery every output directory uses (pipeline.core.outdir,
pipeline.core.claim): one measuring process at a time (an OS lock on the directory itself, released by the kernel when
the holder dies), nothing in it but the report's own files, a finished report (report.json, written last) replaced
only with --overwrite, and only once the new measurement is complete: a measurement that fails leaves the old report
as it was."""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from pipeline.core.claim import DirClaim
from pipeline.core.cli import UsageError
from pipeline.core.io import write_text_atomic
from pipeline.core.outdir import Layout, remove
from pipeline.shards.layout import REPORT_HTML, REPORT_JSON, REPORT_MD, check_out

LAYOUT = Layout(kind="acceptance report", files=(REPORT_MD, REPORT_HTML, REPORT_JSON), done=REPORT_JSON)


def check(out: Path, *, overwrite: bool) -> None:
    """Read-only, before anything is measured: why `out` cannot take this report (a UsageError), or nothing."""
    check_out(out, f"--out {out}:", UsageError)
    if not out.is_dir():
        return
    if foreign := LAYOUT.foreign(out):
        raise UsageError(f"--out {out}: holds files an acceptance report does not write ({', '.join(foreign)}); "
                         "choose an empty or new directory")
    if LAYOUT.is_done(out) and not overwrite:
        raise UsageError(f"--out {out}: holds a finished acceptance report ({REPORT_JSON}); pass --overwrite to "
                         "replace it once the new measurement is complete, or choose another --out")


@contextmanager
def taken(out: Path, *, overwrite: bool) -> Iterator[None]:
    """`out` for this process alone while it measures; a directory this process created is removed again when the
    measurement fails before anything was written."""
    check(out, overwrite=overwrite)
    created = not out.exists()
    try:
        with DirClaim(out, lock_file=None, busy_error=UsageError,
                      refusal=lambda holder: f"--out {out}: another accept is measuring into it ({holder}); wait for "
                                             f"it to finish or choose another --out"):
            check(out, overwrite=overwrite)  # what another process finished there while this one waited
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
