"""Run an engine adapter in another Python (its own virtualenv) behind the same `Engine` interface.

The pipeline's environment never imports vllm or sglang: `RemoteEngine` starts `pipeline.engines.process.worker` with the
engine environment's interpreter and forwards start / capture / info / close over two pipes, with a Unix socket beside them that carries the
descriptors of large payloads in shared memory (see `wire`).
"""
from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from pipeline.core.contracts import Capture, EngineInfo, EngineSpec, Generation, GenerationRequest, PreparedSample
from pipeline.engines.base import Engine, Task
from pipeline.engines.process import wire
from pipeline.points import Point

_PIPE_BYTES = 1 << 20


def _widen(fd: int) -> None:
    """Give the captures' pipe 1 MiB instead of Linux's 64 KiB: fewer wake-ups of reader and writer, so large
    captures cross between the two processes faster (bench/README.md#figures-measured-outside-the-bench-scripts)."""
    try:
        import fcntl

        limit = int(Path("/proc/sys/fs/pipe-max-size").read_text())
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, min(_PIPE_BYTES, limit))
    except (ImportError, AttributeError, OSError, ValueError):  # not Linux, or not allowed: the default pipe works
        pass


class EngineWorkerError(RuntimeError):
    """The engine raised inside its worker; the message carries the worker's traceback, `summary` only the error."""

    def __init__(self, message: str, summary: str | None = None) -> None:
        super().__init__(message)
        self.summary = summary or message


class RemoteEngine(Engine):
    """The adapter `target` ("module:Class") running in `python`'s environment; it is called by its spec's name."""

    options_type = None  # the adapter parses them in its worker

    def __init__(self, spec: EngineSpec, *, target: str, python: str, model_path: str, points: Sequence[Point],
                 num_layers: int, trust_remote_code: bool = False, max_seq_len: int | None = None,
                 task: Task = "capture") -> None:
        super().__init__(spec, model_path=model_path, points=points, num_layers=num_layers,
                         trust_remote_code=trust_remote_code, max_seq_len=max_seq_len, task=task)
        self.name = spec.name
        self.target, self.python = target, python
        self._proc: subprocess.Popen | None = None

    def _spawn(self) -> None:
        to_worker_r, to_worker_w = os.pipe()
        from_worker_r, from_worker_w = os.pipe()
        _widen(from_worker_w)
        self._side, worker_side = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._proc = subprocess.Popen(
            [self.python, "-m", "pipeline.engines.process.worker", self.target, str(to_worker_r), str(from_worker_w),
             str(worker_side.fileno())],
            pass_fds=(to_worker_r, from_worker_w, worker_side.fileno()), stdin=subprocess.DEVNULL)
        os.close(to_worker_r)
        os.close(from_worker_w)
        worker_side.close()
        self._tx = os.fdopen(to_worker_w, "wb")
        self._rx = os.fdopen(from_worker_r, "rb")

    def _call(self, header: dict[str, Any], tensors: dict[str, torch.Tensor] | None = None):
        try:
            wire.send(self._tx, header, tensors, self._side)
            reply, out = wire.recv(self._rx, self._side)
        except (wire.WorkerGone, BrokenPipeError) as e:
            code = self._proc.wait(timeout=30) if self._proc else None
            raise EngineWorkerError(f"{self.target} worker ({self.python}) exited with code {code} during "
                                    f"{header['op']!r}; its log is above on stderr") from e
        if not reply.get("ok"):
            summary = f"{self.target} failed during {header['op']!r}: {reply['error']}"
            raise EngineWorkerError(f"{summary}\n--- worker traceback ---\n{reply['traceback']}", summary)
        return reply, out

    def start(self) -> None:
        self._spawn()
        init = {"spec": self.spec.to_dict(), "model_path": self.model_path,
                "points": [p.label for p in self.points], "num_layers": self.num_layers,
                "trust_remote_code": self.trust_remote_code, "max_seq_len": self.max_seq_len,
                "task": self.task}
        self._call({"op": "init", "init": init})
        self._call({"op": "start"})

    def capture(self, samples: Sequence[PreparedSample]) -> list[Capture]:
        meta = [{"sample_id": s.sample_id, "source": s.source, "row": s.row, "truncated": s.truncated}
                for s in samples]
        tensors = {}
        for i, s in enumerate(samples):
            tensors[f"ids/{i}"] = torch.from_numpy(np.ascontiguousarray(s.input_ids_T, dtype=np.int64))
            tensors[f"mask/{i}"] = torch.from_numpy(np.ascontiguousarray(s.loss_mask_T, dtype=np.uint8))
        reply, out = self._call({"op": "capture", "samples": meta}, tensors)
        return [Capture(sample_id=sid, input_ids_T=out[f"ids/{i}"].numpy(), hidden_states_TPH=out[f"hs/{i}"])
                for i, sid in enumerate(reply["sample_ids"])]

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        reply, _ = self._call({"op": "generate", "requests": [r.to_dict() for r in requests]})
        return [Generation.from_dict(g) for g in reply["generations"]]

    def call(self, method: str, *args: Any) -> Any:
        """An engine-specific extra, run in the worker (JSON-able arguments and result)."""
        return self._call({"op": "call", "method": method, "args": list(args)})[0]["result"]

    def info(self) -> EngineInfo:
        return EngineInfo.from_dict(self._call({"op": "info"})[0]["info"])

    def close(self) -> None:
        if self._proc is None:
            return
        try:
            if self._proc.poll() is None:
                self._call({"op": "close"})
            self._proc.wait(timeout=60)
        except (EngineWorkerError, subprocess.TimeoutExpired):
            self._proc.kill()
            self._proc.wait()
        finally:
            for f in (self._tx, self._rx, self._side):
                try:
                    f.close()
                except BrokenPipeError:  # a worker that exited mid-message: the unsent rest no longer matters
                    pass
            self._proc = None
