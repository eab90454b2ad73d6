"""transformers' weight-load report, held while a wrapper's text model loads, and given back unless all it lists is
the wrapper's own weights outside the text model.

Loading Kimi-K2.5's text model from the multimodal checkpoint leaves the vision tower and its projector unread, by
design (the capture is text-only), and transformers 5.19 reports every one of them as UNEXPECTED in a table of ~25
lines, once per engine that loads the model: the first thing a user saw looked like an error. That case is summed up
in one line; a report with anything else in it (a MISSING or MISMATCHED weight, an unexpected weight of the text
model itself, a conversion error) is shown as transformers wrote it, and so is every report of a load that fails.
"""
from __future__ import annotations

import logging
from collections import Counter
from contextlib import contextmanager
from typing import Any, Iterator

# transformers logs the report as one warning on this logger (transformers/utils/loading_report.py).
_REPORT_LOGGER = "transformers.modeling_utils"
_REPORT_MARK = "LOAD REPORT"
log = logging.getLogger(__name__)


class _Hold(logging.Filter):
    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path  # the report names the checkpoint it loads: another thread's load is not held
        self.records: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        text = str(record.msg)
        if _REPORT_MARK in text and f"from: {self.path}" in text:
            self.records.append(record)
            return False
        return True

    def give_back(self) -> None:
        """Log the held records as transformers would have; only once the hold is off the logger (else it would
        take them again)."""
        records, self.records = self.records, []
        for record in records:
            logging.getLogger(_REPORT_LOGGER).handle(record)


@contextmanager
def held_load_report(path: str) -> Iterator[_Hold]:
    """Hold transformers' load report of the checkpoint at `path` for the block (then `settle` it); a block that
    raises gives it back."""
    hold = _Hold(path)
    logger = logging.getLogger(_REPORT_LOGGER)
    logger.addFilter(hold)
    try:
        yield hold
    except BaseException:
        logger.removeFilter(hold)
        hold.give_back()
        raise
    logger.removeFilter(hold)


def wrapper_only(loading: dict[str, Any], text_prefixes: tuple[str, ...]) -> list[str]:
    """The unexpected weights of a load when each is the wrapper's own (named outside `text_prefixes`, where its text
    weights are mapped to) and nothing else went wrong; else []."""
    unexpected = sorted(loading.get("unexpected_keys") or [])
    if any(loading.get(key) for key in ("missing_keys", "mismatched_keys", "error_msgs")):
        return []
    return [] if any(k.startswith(text_prefixes) for k in unexpected) else unexpected


def settle(hold: _Hold, loading: dict[str, Any], wrapper: str, text_prefixes: tuple[str, ...]) -> None:
    """After the held block: one line for a report that lists only the wrapper's own weights; the report itself
    otherwise."""
    skipped = wrapper_only(loading, text_prefixes)
    if not (skipped and hold.records):
        hold.give_back()
        return
    hold.records.clear()
    parts = Counter(key.split(".", 1)[0] for key in skipped)
    log.info("skipped %d weights of the %s checkpoint outside its text model (%s): the text model does not use them",
             len(skipped), wrapper, ", ".join(f"{part}: {n}" for part, n in sorted(parts.items())))
