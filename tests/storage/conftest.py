"""A SeaweedFS server on loopback for the storage tests (one per test worker), and a fresh prefix per test."""
from __future__ import annotations

import uuid

import pytest

from tests.helpers import seaweed
from tests.helpers.runs import SMALL, finished_run


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    server = seaweed.start(tmp_path_factory.mktemp("seaweed"))
    yield server
    server.stop()


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """The server's endpoint and credentials in the standard AWS variables, as a user sets them."""
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    return s3_server


@pytest.fixture
def s3_url(s3_env):
    return s3_env.url(f"t-{uuid.uuid4().hex[:12]}")


@pytest.fixture(scope="module")
def local_run(tmp_path_factory, models_root):
    return finished_run(tmp_path_factory, "local", *SMALL)
