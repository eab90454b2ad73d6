"""One writer per run directory: a second submission while the first runs or finishes never touches its output, a
lease renewed from another host is respected, and a run whose directory was taken over stops before finishing a
shard. Every case runs real extract processes on the tiny default."""
from __future__ import annotations

import json
import socket
import time

import pytest

from tests.helpers.runs import (
    SMALL,
    error_lines,
    extract,
    output,
    shards_of,
    snapshot,
    start,
    verify,
    wait_for_step,
    wait_for_text,
)

pytestmark = pytest.mark.reliability


def _release(go, proc):
    go.touch()
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out + err


def test_a_second_run_exits_at_once_while_the_first_holds_the_directory(tmp_path):
    out, go, trace = tmp_path / "run", tmp_path / "go", tmp_path / "steps"
    first = start(out, *SMALL, fault=f"pause={go}@rename:shard-00000.done.json", trace=trace)
    try:
        wait_for_step(trace, "rename:shard-00000.done.json", first)
        for overrides in (SMALL, (*SMALL, "data.limit=4")):  # the same command, and another config
            t0 = time.monotonic()
            second = extract(out, *overrides)
            assert second.returncode == 2
            (line,) = error_lines(second)
            assert f"is in use by pid {first.pid} on host {socket.gethostname()}" in line
            assert "wait_for_lock=true" in line
            assert time.monotonic() - t0 < 60  # at once: it loaded no model
        before = snapshot(out)
    finally:
        rc, text = _release(go, first)
    assert rc == 0, text[-3000:]
    assert all(snapshot(out)[k] == v for k, v in before.items() if k != ".lock")  # nothing was touched
    assert verify(out).returncode == 0


def test_a_second_start_while_the_first_finishes_leaves_the_finished_run_alone(tmp_path):
    """The reported loss: the second passed its start-up check while the first ran, and deleted the first's output
    once it had finished. Now the second waits for the lock (wait_for_lock=true), then finds a finished run."""
    out, go, trace = tmp_path / "run", tmp_path / "go", tmp_path / "steps"
    first = start(out, *SMALL, fault=f"pause={go}@write:manifest.json", trace=trace)
    second = None
    try:
        wait_for_step(trace, "write:manifest.json", first)
        log = tmp_path / "second.log"
        second = start(out, *SMALL, "wait_for_lock=true", log=log)
        wait_for_text(log, "waiting for it (wait_for_lock=true)", second)  # it passed every start-up check
        rc, text = _release(go, first)
        assert rc == 0, text[-3000:]
        finished = snapshot(out)
        second.wait(timeout=300)
    finally:
        if second is not None and second.poll() is None:
            second.kill()
        if first.poll() is None:
            first.kill()
    assert second.returncode == 2 and "holds a finished run (manifest.json)" in log.read_text()
    after = snapshot(out)
    assert {k: v for k, v in after.items() if k != ".lock"} == {k: v for k, v in finished.items() if k != ".lock"}
    assert verify(out).returncode == 0


def _lease(out, *, host, age, token="f" * 16):
    out.mkdir(parents=True, exist_ok=True)
    (out / ".lock").write_text(json.dumps({"pid": 4242, "host": host, "token": token, "started_utc": "earlier",
                                           "heartbeat": time.time() - age, "released": False}))


def test_a_lease_renewed_from_another_host_is_respected(tmp_path):
    """A shared volume whose file system does not pass flock between hosts: the lease's heartbeat still tells."""
    out = tmp_path / "run"
    _lease(out, host="other-node", age=1)
    busy = extract(out, *SMALL)
    assert busy.returncode == 2
    assert "is in use by pid 4242 on host other-node" in error_lines(busy)[0]
    _lease(out, host="other-node", age=3600)  # its holder stopped renewing an hour ago
    taken = extract(out, *SMALL)
    assert taken.returncode == 0, output(taken)[-3000:]
    assert "taking over the lock of pid 4242 on host other-node" in output(taken)
    assert verify(out).returncode == 0


def test_a_run_whose_directory_was_taken_over_finishes_no_shard(tmp_path):
    """Another host took the directory over (its lease replaced ours) while our writer was busy: the writer checks
    the lease before a shard's marker and stops; the shard stays unfinished, no manifest is written."""
    out, go, trace = tmp_path / "run", tmp_path / "go", tmp_path / "steps"
    first = start(out, *SMALL, fault=f"pause={go}@rename:shard-00000.parquet", trace=trace)
    try:
        wait_for_step(trace, "rename:shard-00000.parquet", first)
        _lease(out, host="other-node", age=0, token="0" * 16)
    finally:
        rc, text = _release(go, first)
    assert rc == 1
    (line,) = [x for x in text.splitlines() if "[ERROR]" in x]
    assert "is no longer this run's (its lock is held by pid 4242 on host other-node" in line
    assert not (out / "shards" / "shard-00000.done.json").exists() and not (out / "manifest.json").exists()
    _lease(out, host="other-node", age=3600)  # that holder went away too: the same command completes the run
    done = extract(out, *SMALL)
    assert done.returncode == 0, output(done)[-3000:]
    assert verify(out).returncode == 0 and len(shards_of(out)) == 2
