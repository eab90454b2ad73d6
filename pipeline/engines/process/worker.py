"""An engine in its own process (and virtualenv): `python -m pipeline.engines.process.worker TARGET IN_FD OUT_FD
[SIDE_FD]` (SIDE_FD: a Unix socket for the descriptors of payloads sent in shared memory, see `wire`).

vLLM and SGLang pin torch builds that cannot share an environment with each other or with the pipeline, so their
adapters run here, in the engine's own virtualenv, driven by `pipeline.engines.process.remote.RemoteEngine` over two pipes
(stdout stays free for the engine's own chatter, which goes to stderr).
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import socket
import sys
import traceback
from typing import Any

import numpy as np
import torch

from pipeline.core.contracts import EngineSpec, GenerationRequest, PreparedSample
from pipeline.engines.process import wire
from pipeline.points import parse_points


def _load(target: str, init: dict[str, Any]):
    module_name, cls_name = target.split(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    # An engine started to generate captures nothing: no points.
    points = parse_points(init["points"], num_layers=init["num_layers"]) if init["points"] else []
    return cls(EngineSpec(**init["spec"]), model_path=init["model_path"], points=points, num_layers=init["num_layers"],
               trust_remote_code=bool(init.get("trust_remote_code", False)), max_seq_len=init.get("max_seq_len"),
               task=init.get("task", "capture"))


def _samples(header: dict[str, Any], tensors: dict[str, torch.Tensor]) -> list[PreparedSample]:
    return [PreparedSample(sample_id=s["sample_id"], source=s["source"], row=s["row"], truncated=s["truncated"],
                           input_ids_T=tensors[f"ids/{i}"].numpy(), loss_mask_T=tensors[f"mask/{i}"].numpy())
            for i, s in enumerate(header["samples"])]


def _handle(engine, header: dict[str, Any], tensors: dict[str, torch.Tensor]):
    op = header["op"]
    if op == "start":
        engine.start()
        return {"ok": True}, None
    if op == "info":
        return {"ok": True, "info": dataclasses.asdict(engine.info())}, None
    if op == "capture":
        captures = engine.capture(_samples(header, tensors))
        out = {}
        for i, c in enumerate(captures):
            out[f"hs/{i}"] = c.hidden_states_TPH
            out[f"ids/{i}"] = torch.from_numpy(np.ascontiguousarray(c.input_ids_T, dtype=np.int64))
        return {"ok": True, "sample_ids": [c.sample_id for c in captures]}, out
    if op == "generate":  # token ids as JSON lists: small beside the forward they cost
        generations = engine.generate([GenerationRequest.from_dict(r) for r in header["requests"]])
        return {"ok": True, "generations": [g.to_dict() for g in generations]}, None
    if op == "call":  # engine-specific extras (e.g. a determinism probe), by method name
        return {"ok": True, "result": getattr(engine, header["method"])(*header.get("args", []))}, None
    raise ValueError(f"unknown op {op!r}")


def serve(target: str, rx, tx, side: socket.socket | None = None) -> None:
    header, _ = wire.recv(rx, side)
    try:
        engine = _load(target, header["init"])
    except Exception as e:
        wire.send(tx, {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
        return
    wire.send(tx, {"ok": True})
    while True:
        try:
            header, tensors = wire.recv(rx, side)
        except wire.WorkerGone:
            break
        if header["op"] == "close":
            engine.close()
            wire.send(tx, {"ok": True})
            break
        try:
            reply, out = _handle(engine, header, tensors)
        except Exception as e:  # reported to the caller, which raises it with this traceback
            reply, out = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}, None
        wire.send(tx, reply, out, side)
        del out  # not held while waiting for the next request (shared: the caller holds the memory now)


def main() -> None:
    target, in_fd, out_fd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    side = socket.socket(fileno=int(sys.argv[4])) if len(sys.argv) > 4 else None
    os.dup2(2, 1)  # engines print to stdout; keep the caller's terminal output for the caller
    with os.fdopen(in_fd, "rb") as rx, os.fdopen(out_fd, "wb") as tx:
        serve(target, rx, tx, side)


if __name__ == "__main__":
    main()
