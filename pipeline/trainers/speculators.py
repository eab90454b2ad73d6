"""`python -m pipeline.trainers.speculators ARGS...` (or `torchrun -m pipeline.trainers.speculators ARGS...`):
speculators' own training CLI (`python -m speculators.train`), unchanged, with this project's hidden-states backend
registered (pipeline/trainers/speculators_backend.py). Run it with speculators' environment (.venv-speculators).

An export on object storage (`--data-path s3://bucket/prefix`) is copied into the local spool first ($PIPELINE_SPOOL_DIR,
default ~/.cache/pipeline/spool: a reference export's few small files; every file of a full copy) and read from there,
as are `--d2t-path`/`--t2d-path` under it.
On an export made with `--states reference` (its export.json says so) the backend is chosen for you
(`--hidden-states-backend pipeline-run`): the trainer reads every state from the run, checked on arrival. Any other
export is handed to speculators as it is. A run moved, replaced or edited since the export, or a sample that fails a
check, stops the trainer with one line naming it (exit 2): never a skipped sample.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Sequence

BACKEND = "pipeline-run"  # speculators_backend.BACKEND (importing it needs hs_connectors: only after the checks)
PROG = "pipeline.trainers.speculators"
SPOOL_ENV = "PIPELINE_SPOOL_DIR"  # where an export on object storage is copied (default ~/.cache/pipeline/spool)


def _value(argv: Sequence[str], flag: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def _local(argv: list[str], url: str, local: str) -> list[str]:
    """argv with the export's URL, and the files under it (its --d2t-path, --t2d-path), read from its local copy."""
    base = url.rstrip("/")

    def one(arg: str) -> str:
        flag, eq, value = arg.partition("=") if arg.startswith("--") else ("", "", arg)
        if value.rstrip("/") == base or value.startswith(base + "/"):
            value = local + value.rstrip("/")[len(base):]
        return f"{flag}{eq}{value}"
    return [one(arg) for arg in argv]


def prepared_argv(argv: Sequence[str]) -> list[str]:
    """argv with the backend chosen for a reference export, and an export on object storage (`--data-path
    s3://...`) read from a local copy (pipeline.exports.target.export_copy: the trainer reads local files); SystemExit(2)
    for a backend that cannot read it or a URL that holds no finished export."""
    argv = list(argv)
    data_path = _value(argv, "--data-path")
    if data_path is not None and data_path.startswith("s3://"):
        from pipeline.core.storage import StorageError
        from pipeline.core.store_dir import DEFAULT_SPOOL
        from pipeline.exports.target import export_copy

        try:
            local = str(export_copy(data_path, os.environ.get(SPOOL_ENV) or DEFAULT_SPOOL))
        except StorageError as exc:
            raise SystemExit(f"{PROG}: --data-path {exc}") from None
        argv, data_path = _local(argv, data_path, local), local
    sidecar = Path(data_path) / "export.json" if data_path else None
    if sidecar is None or not sidecar.is_file():
        return argv
    try:
        reference = json.loads(sidecar.read_text(encoding="utf-8")).get("states") == "reference"
    except (OSError, ValueError, AttributeError):
        return argv  # not ours to judge: speculators reads it as it would
    backend = _value(argv, "--hidden-states-backend")
    if reference and backend is None:
        return [*argv, "--hidden-states-backend", BACKEND]
    if reference and backend != BACKEND:
        raise SystemExit(f"{PROG}: --data-path {data_path} is a reference export (its states are in its run, "
                         f"not in hidden_states/): use --hidden-states-backend {BACKEND}, or leave it out")
    return argv


def register() -> None:
    """Register the backend; before speculators' config resolution is imported (it collects backends then)."""
    import pipeline.trainers.speculators_backend  # noqa: F401


def _one_line(exc: BaseException) -> str:
    """The error's own line; a data loader worker's error comes back wrapped with its traceback in the message."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[-1].split("RunStatesError: ", 1)[-1] if lines else type(exc).__name__


def main(argv: Sequence[str] | None = None) -> int:
    argv = prepared_argv(sys.argv[1:] if argv is None else argv)
    register()
    from pipeline.exports.run_states import RunStates, RunStatesError

    try:
        if _value(argv, "--hidden-states-backend") == BACKEND and (data_path := _value(argv, "--data-path")):
            RunStates(data_path).check()  # before speculators loads a model or creates its save path
        from speculators.train.cli import main as train
        from speculators.train.config import TrainConfig

        train(TrainConfig.resolve(argv))
    except RunStatesError as exc:
        print(f"{PROG}: {_one_line(exc)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
