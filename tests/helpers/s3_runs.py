"""Runs written to object storage by the tests (SeaweedFS on loopback, tests/helpers/seaweed.py), and the check that one
is a local run's bytes."""
from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from pipeline.core.stores import open_store
from tests.helpers.runs import REPO, SMALL, env_with

# Files a run writes that depend on where and when it ran: the lease, the manifest's provenance (out_dir, host,
# time) and the attestation over it. Every other object is byte for byte the local run's file.
PLACE_BOUND = {".lock", "manifest.json", "attestation.intoto.json"}


def extract_s3(url: str, tmp: Path, server, *overrides: str, fault: str | None = None,
               env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pipeline.extract", f"out_dir={url}", f"hydra.run.dir={tmp}/logs",
           f"spool_dir={tmp}/spool", *SMALL, *overrides]
    extra = {**server.env, **(env or {}), **({"PIPELINE_FAULT": fault} if fault else {})}
    return subprocess.run(cmd, cwd=REPO, env=env_with(**extra), capture_output=True, text=True, timeout=300)


def objects(url: str) -> dict[str, str]:
    store = open_store(url)
    return {o.key: hashlib.sha256(store.get(o.key)).hexdigest() for o in store.list()}


def files(run: Path) -> dict[str, str]:
    return {p.relative_to(run).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run.rglob("*")) if p.is_file()}


def same_run(url: str, local: Path) -> None:
    there, here = objects(url), files(local)
    assert there.keys() == here.keys()
    assert {k: v for k, v in there.items() if k not in PLACE_BOUND} == \
        {k: v for k, v in here.items() if k not in PLACE_BOUND}
