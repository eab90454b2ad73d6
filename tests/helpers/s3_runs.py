"""Runs written to object storage by the tests (SeaweedFS on loopback, tests/helpers/seaweed.py), and the check that one
is a local run's bytes."""
from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from pipeline.core.stores import open_store
from tests.helpers.runs import REPO, SMALL, env_with, output

# Files a run writes that depend on where and when it ran: the lease, the manifest's provenance (out_dir, host,
# time) and the attestation over it. Every other object is byte for byte the local run's file.
PLACE_BOUND = {".lock", "manifest.json", "attestation.intoto.json"}


def extract_s3_cmd(url: str, tmp: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "pipeline.extract", f"out_dir={url}", f"hydra.run.dir={tmp}/logs",
            f"spool_dir={tmp}/spool", *SMALL, *overrides]


def s3_run_env(server, env: dict | None = None, fault: str | None = None) -> dict[str, str]:
    """The environment of an extract writing to `server`: its endpoint and credentials, as a user sets them."""
    return env_with(**{**server.env, **(env or {}), **({"PIPELINE_FAULT": fault} if fault else {})})


def extract_s3(url: str, tmp: Path, server, *overrides: str, fault: str | None = None,
               env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(extract_s3_cmd(url, tmp, *overrides), cwd=REPO, env=s3_run_env(server, env, fault),
                          capture_output=True, text=True, timeout=300)


def objects(url: str) -> dict[str, str]:
    store = open_store(url)
    return {o.key: hashlib.sha256(store.get(o.key)).hexdigest() for o in store.list()}


def files(run: Path) -> dict[str, str]:
    return {p.relative_to(run).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run.rglob("*")) if p.is_file()}


def same_run(url: str, local: Path) -> None:
    there, here = objects(url), files(local)
    assert there.keys() == here.keys()
    differ = sorted(k for k in there if k not in PLACE_BOUND and there[k] != here[k])
    assert not differ, f"objects of {url} that are not the local run's bytes: {differ}"


def killed_then_resumed(write, url: str, step: str, noun: str) -> subprocess.CompletedProcess | None:
    """`write(fault=...)` (a job writing to `url`) killed at `step`, then run again: the rerun, which resumed it (None
    when the kill came after the manifest was in place: the rerun refused the finished `noun`, as it must). Either
    way no manifest is visible before the kill's step put it there, and no multipart upload is left."""
    killed = write(fault=f"kill@{step}")
    assert killed.returncode == -9, output(killed)[-2000:]
    store = open_store(url)
    assert (store.head("manifest.json") is None) == (step != "rename:manifest.json")
    resumed = write()
    finished = step == "rename:manifest.json"
    if finished:
        assert resumed.returncode == 2 and f"holds a finished {noun}" in output(resumed), output(resumed)[-3000:]
    else:
        assert resumed.returncode == 0, output(resumed)[-3000:]
    assert store.unfinished() == []
    return None if finished else resumed


def left_nothing_behind(url: str, spool: Path, noun: str) -> None:
    """A finished job on `url`: no multipart upload left, and its spool emptied."""
    assert open_store(url).unfinished() == []
    assert list(spool.iterdir()) == [], f"the spool keeps nothing of a finished {noun}"


def finished_on(done: subprocess.CompletedProcess, url: str, spool: Path, noun: str) -> None:
    """A job that wrote its `noun` to `url` and finished: exit 0, the directory named by its URL, nothing left
    behind (no multipart upload, an empty spool)."""
    assert done.returncode == 0, output(done)[-3000:]
    assert f"{noun} directory: {url}" in done.stdout
    left_nothing_behind(url, spool, noun)
