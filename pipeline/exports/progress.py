"""Progress of an export: a live bar on a terminal, and a log line per finished shard of the run everywhere."""
from __future__ import annotations

import logging
import time

from pipeline.core.bar import live_bar

log = logging.getLogger("pipeline.exports")


class ExportProgress:
    """Samples and bytes done, MB/s of written hidden states and ETA; samples found finished do not count as rate."""

    def __init__(self, *, name: str, num_samples: int, num_tokens: int) -> None:
        self.name = name
        self.num_samples, self.num_tokens = num_samples, num_tokens
        self.written = self.skipped = self.bytes = self.tokens_done = 0
        self._tokens_written = 0
        self._started = time.perf_counter()
        self._bar = live_bar(f"export {name}", "{task.fields[mb_s]:>7.1f} MB/s")
        self._task = self._bar.add_task(name, total=num_samples, mb_s=0.0)

    def __enter__(self) -> "ExportProgress":
        self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.stop()

    def sample(self, *, num_tokens: int, num_bytes: int, skipped: bool) -> None:
        self.tokens_done += num_tokens
        if skipped:
            self.skipped += 1
        else:
            self.written += 1
            self.bytes += num_bytes
            self._tokens_written += num_tokens
        self._bar.update(self._task, advance=1, mb_s=self.bytes / 1e6 / self.elapsed)

    @property
    def elapsed(self) -> float:
        return max(time.perf_counter() - self._started, 1e-9)

    def shard_done(self, shard: int, num_shards: int) -> None:
        rate = self._tokens_written / self.elapsed
        left = self.num_tokens - self.tokens_done
        log.info("export %s: shard %d/%d done | %d/%d samples (%d finished earlier) | %.1f MB/s, %.0f tok/s, "
                 "ETA %.0fs", self.name, shard + 1, num_shards, self.written + self.skipped, self.num_samples,
                 self.skipped, self.bytes / 1e6 / self.elapsed, rate, left / rate if rate else 0.0)
