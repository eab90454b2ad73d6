"""SGLang TP's lockstep bookkeeping (pipeline/engines/sglang/tp.py, runner.py), the parts that need no GPU: rank 0
always reads every follower's reply, also when its own forward raised (else the next forward reads stale replies),
and a follower that is gone is RankFailed at the next send, not a bare BrokenPipeError. TP > 1 itself runs on GPUs
only (docs/engines.md, "SGLang tensor parallelism")."""
from __future__ import annotations

import multiprocessing

import numpy as np
import pytest

from pipeline.engines.sglang.runner import ModelRunnerSession
from pipeline.engines.sglang.tp import Followers, RankFailed


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def send(self, op, payload) -> None:
        self.calls.append(f"send {op}")

    def wait(self, what) -> None:
        self.calls.append(f"wait {what}")


def test_rank_0_reads_the_followers_replies_even_when_its_forward_raises():
    session = object.__new__(ModelRunnerSession)
    session.followers = _Recorder()

    def broken(seqs, discard=False):
        raise RuntimeError("aux width")

    session._forward = broken
    with pytest.raises(RuntimeError, match="aux width"):
        session.forward([np.arange(3)])
    assert session.followers.calls == ["send forward", "wait forward"]


def _exit_at_once(conn) -> None:
    conn.close()


def test_a_follower_that_is_gone_is_rank_failed_at_the_next_send():
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_exit_at_once, args=(child,))
    proc.start()
    child.close()
    proc.join(30)
    followers = object.__new__(Followers)
    followers.conns, followers.procs = [parent], [proc]
    with pytest.raises(RankFailed, match=r"TP rank 1 is gone \(exit code 0\) before 'forward'"):
        for _ in range(64):  # a pipe's buffer can take a few sends before the closed end is noticed
            followers.send("forward", [np.arange(4096)])
