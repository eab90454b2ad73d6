"""One writer per location on object storage (pipeline/core/storeclaim.py), on a real S3 server: a second claimant is
refused naming the holder, a lease not renewed is taken over after its timeout (shortened here), and the holder that
lost it neither passes its check nor writes over the new holder's lease."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.core.claim import ClaimLost, DirBusy
from pipeline.core.stores import open_store
from pipeline.core.storeclaim import StoreClaim

REPO = Path(__file__).resolve().parents[2]
FAST = {"heartbeat_seconds": 0.3, "stale_seconds": 3.0}


def test_a_second_claimant_is_refused_naming_the_holder(s3_url):
    store = open_store(s3_url)
    with StoreClaim(store, ".lock", **FAST) as first:
        with pytest.raises(DirBusy, match=r"is in use by pid \d+ on host .* renewed \d+s ago"):
            with StoreClaim(store, ".lock", **FAST):
                pass
        time.sleep(4 * FAST["heartbeat_seconds"])
        first.check()  # renewed several times, still this holder's
    lease = json.loads(store.get(".lock"))
    assert lease["released"] is True and lease["token"] == first.token
    with StoreClaim(store, ".lock", **FAST) as again:  # a released lease is taken at once
        again.check()


_HOLD = """
import sys, time
from pipeline.core.stores import open_store
from pipeline.core.storeclaim import StoreClaim
with StoreClaim(open_store(sys.argv[1]), ".lock", heartbeat_seconds=0.3, stale_seconds=3.0) as claim:
    print(claim.token, flush=True)
    time.sleep(600)
"""


def test_a_lease_of_a_holder_killed_on_this_host_is_taken_over_at_once(s3_url, s3_env):
    store = open_store(s3_url)
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, s3_url], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        token = holder.stdout.readline().strip()
        assert json.loads(store.get(".lock"))["token"] == token
        with pytest.raises(DirBusy):  # alive: refused
            with StoreClaim(store, ".lock", **FAST):
                pass
    finally:
        holder.kill()  # kill -9: the lease stays, unreleased and fresh
        holder.wait()
    with StoreClaim(store, ".lock", heartbeat_seconds=0.3, stale_seconds=600.0) as taker:  # no wait, no ageing
        assert json.loads(store.get(".lock"))["token"] == taker.token


def test_a_lease_of_another_host_not_renewed_is_taken_over_after_its_timeout(s3_url, s3_env):
    store = open_store(s3_url)
    lease = {"pid": 1, "host": "another-host", "token": "0123456789abcdef", "heartbeat": time.time(),
             "started_utc": "2026-12-05T00:00:00+00:00", "released": False}
    store.put(".lock", json.dumps(lease).encode(), create=True)  # its process cannot be seen from here
    with pytest.raises(DirBusy, match="pid 1 on host another-host"):
        with StoreClaim(store, ".lock", **FAST):
            pass
    started = time.monotonic()
    with StoreClaim(store, ".lock", wait=True, heartbeat_seconds=0.3, stale_seconds=5.0) as taker:
        waited = time.monotonic() - started
        assert json.loads(store.get(".lock"))["token"] == taker.token
    assert waited >= 2.0, f"took over a lease 5 s may not take after waiting only {waited:.1f}s"


def test_the_holder_that_lost_its_lease_fails_its_check_and_leaves_the_new_one(s3_url):
    store = open_store(s3_url)
    old = StoreClaim(store, ".lock", **FAST).__enter__()
    old._stop.set()  # a holder cut off from the store: it renews no more
    old._beat.join()
    with StoreClaim(store, ".lock", wait=True, **FAST) as new:
        with pytest.raises(ClaimLost, match="no longer this run's"):
            old.check()
        old.__exit__(None, None, None)  # its release is refused: the lease is the new holder's version
        lease = json.loads(store.get(".lock"))
        assert lease["token"] == new.token and lease["released"] is False
        new.check()


def test_preparing_a_finished_export_on_a_store_keeps_it(s3_url, tmp_path):
    """`prepare` under a plan that keeps what the prefix holds ("complete": the same export finished) removes nothing;
    only a resume removes a completing object `inspect` could not read."""
    from pipeline.core import store_dir
    from pipeline.exports.sidecar import export_dir
    from pipeline.exports.speculators import FILES
    from pipeline.exports.target import LEASE

    kind = export_dir(FILES, lease=LEASE)
    store = open_store(s3_url)
    store.put("export.json", b'{"sidecar_version": "2"}')
    store.put("state.json", b"{}")
    target = store_dir.StoreTarget(url=s3_url, endpoint=None, lock=LEASE, token="t", spool_root=str(tmp_path))
    for plan in ("complete", "resume"):
        store_dir.StoreHeld(url=s3_url, out=tmp_path, record={}, plan=plan, kind=kind, target=target).prepare()
        keys = {o.key for o in store.list()}
        assert ("export.json" in keys) == (plan == "complete") and "state.json" in keys, (plan, keys)
