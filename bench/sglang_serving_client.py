"""Drive `bench/sglang_serving.py` (a real `sglang.Engine`) from the pipeline's environment.

Used by bench/sglang_throughput.py (plain prefill throughput) and by the SGLang tests (the serving path's post-norm
states against the in-process runner's). No SGLang import here.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from pipeline.engines.registry import REPO_ROOT, engine_python
from pipeline.engines.sglang.adapter import SGLangEngine


class ServingEngine:
    """One `sglang.Engine` in its own process, started on the prompts it will be asked to run."""

    def __init__(self, model_path: str, prompts: Sequence[np.ndarray], *, dtype: str = "auto",
                 hidden_states: bool = False, aux_ids: Sequence[int] = (), cpu: bool | None = None,
                 max_total_tokens: int = 32768) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="sglang-serving-")
        requests = Path(self._dir.name) / "requests.safetensors"
        ids = [np.asarray(p, dtype=np.int64) for p in prompts]
        save_file({"input_ids": torch.from_numpy(np.concatenate(ids)),
                   "offsets": torch.tensor(np.cumsum([0] + [len(p) for p in ids]), dtype=torch.int64)}, str(requests))
        python = engine_python(SGLangEngine, {}) or sys.executable
        env = dict(os.environ)
        if cpu if cpu is not None else not torch.cuda.is_available():
            env["SGLANG_USE_CPU_ENGINE"] = "1"
        cmd = [python, str(REPO_ROOT / "bench" / "sglang_serving.py"), "--model", model_path, "--requests", str(requests),
               "--dtype", dtype, "--max-total-tokens", str(max_total_tokens), "--aux-ids", ",".join(map(str, aux_ids))]
        self._proc = subprocess.Popen(cmd + (["--hidden-states"] if hidden_states else []), cwd=REPO_ROOT, env=env,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.ready = self._read()

    def _read(self) -> dict[str, Any]:
        line = self._proc.stdout.readline()
        if not line:
            code = self._proc.wait(timeout=60)
            raise RuntimeError(f"bench/sglang_serving.py exited with code {code}; its log is above on stderr")
        return json.loads(line)

    def _ask(self, line: str) -> dict[str, Any]:
        self._proc.stdin.write(line + "\n")
        self._proc.stdin.flush()
        return self._read()

    def time_prefill(self) -> dict[str, Any]:
        """Plain prefill (max_new_tokens=1) over every prompt: {"seconds", "tokens"}."""
        return self._ask("time")

    def hidden_states(self) -> tuple[dict[str, Any], list[torch.Tensor]]:
        """generate(return_hidden_states=True): the timing and each prompt's returned states, as tensors."""
        out = Path(self._dir.name) / "hidden.safetensors"
        reply = self._ask(f"hidden {out}")
        tensors = load_file(str(out))
        return reply, [tensors[f"hs/{i}"] for i in range(len(tensors))]

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                self._proc.stdin.write("quit\n")
                self._proc.stdin.close()
                self._proc.wait(timeout=120)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
        self._dir.cleanup()

    def __enter__(self) -> "ServingEngine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
