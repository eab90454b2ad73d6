"""Tensor parallelism for the in-process SGLang runner: ranks 1..tp-1 in processes of their own, in lockstep.

`sglang.benchmark.one_batch` runs TP the same way: one process per rank, each loading its shard of the model with
`load_model(..., tp_rank=r)` and running every forward (the collectives inside need all ranks). Rank 0 lives in the
engine's worker and sends each batch (token ids only) to the followers before running it itself; followers discard
their results and acknowledge, so an error on any rank is raised by rank 0 with that rank's traceback.

Followers are spawned (a fresh interpreter), so this module imports nothing of SGLang at module level: on CPU the
compatibility layer must be active before SGLang's first import, which `follower_main` does first.
"""
from __future__ import annotations

import multiprocessing
import sys
import traceback
from typing import Any

from pipeline.engines.sglang import cpu as sglang_cpu
from pipeline.engines.sglang.runner import (
    ModelRunnerSession,
    RunnerSettings,
    set_platform_env,
)

START_TIMEOUT_S = 1800.0  # loading a shard of a large checkpoint


class RankFailed(RuntimeError):
    """A follower rank raised or died; the message carries its traceback."""


def follower_main(settings: RunnerSettings, rank: int, conn: Any) -> None:
    set_platform_env(settings.device)
    if settings.device == "cpu":
        sglang_cpu.activate()
    session = ModelRunnerSession(settings, tp_rank=rank)
    try:
        session.start()
        conn.send(("ok", None))
        while True:
            op, payload = conn.recv()
            if op == "close":
                break
            session.forward(payload, discard=True)  # rank 0's results are used; nothing copied to the host here
            conn.send(("ok", None))
    except Exception:  # reported to rank 0, which raises it; also printed, in case rank 0 is stuck in a collective
        detail = traceback.format_exc()
        print(f"sglang TP rank {rank} failed:\n{detail}", file=sys.stderr, flush=True)
        conn.send(("error", detail))
    finally:
        session.close()


class Followers:
    """TP ranks 1..tp_size-1, started at construction (they join torch.distributed while rank 0 loads)."""

    def __init__(self, settings: RunnerSettings) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conns, self.procs = [], []
        for rank in range(1, settings.tp_size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=follower_main, args=(settings, rank, child), daemon=True,
                               name=f"sglang-tp-rank{rank}")
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)

    def send(self, op: str, payload: Any) -> None:
        for rank, (conn, proc) in enumerate(zip(self.conns, self.procs), start=1):
            try:
                conn.send((op, payload))
            except (BrokenPipeError, OSError) as e:
                proc.join(5)
                raise RankFailed(f"TP rank {rank} is gone (exit code {proc.exitcode}) before {op!r}") from e

    def wait(self, what: str, timeout: float = START_TIMEOUT_S) -> None:
        for rank, (conn, proc) in enumerate(zip(self.conns, self.procs), start=1):
            if not conn.poll(timeout):
                raise RankFailed(f"TP rank {rank} did not finish {what!r} within {timeout:.0f} s "
                                 f"(alive: {proc.is_alive()}, exit code {proc.exitcode})")
            try:
                status, detail = conn.recv()
            except EOFError as e:
                proc.join(5)
                raise RankFailed(f"TP rank {rank} exited with code {proc.exitcode} during {what!r}") from e
            if status != "ok":
                raise RankFailed(f"TP rank {rank} failed during {what!r}:\n{detail}")

    def close(self) -> None:
        for conn, proc in zip(self.conns, self.procs):
            try:
                conn.send(("close", None))
            except (BrokenPipeError, OSError):
                pass
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()
                proc.join()
        self.conns, self.procs = [], []
