"""Run by .venv-sglang/bin/python: load a draft into SGLang's own draft class with SGLang's own model loader on CPU.

    python sglang_load.py RESULT_JSON DRAFT_DIR [DRAFT_DIR ...]

The draft is published as SGLang publishes a served model (ServerArgs, runtime context, parallel groups of one
rank), its ModelConfig built with is_draft_model=True, and `sglang.srt.model_loader.get_model` builds the class its
architectures name and feeds it the checkpoint's tensors through its own `load_weights`, which `track.Tracker`
watches. Writes one {"class", "num_tensors", "dropped", "uninitialised", "partial", "wrote"} per draft, in order
(several drafts share one start-up: the parallel groups are built once per process).
"""
from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from pipeline.drafts.probes.track import Tracker  # noqa: E402
from pipeline.engines.sglang.cpu import activate  # noqa: E402


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(result: Path, drafts: list[str]) -> None:
    activate()
    import torch
    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.distributed.bootstrap import init_parallel_runtime
    from sglang.srt.entrypoints.engine import _set_envs_and_config
    from sglang.srt.model_loader import get_model
    from sglang.srt.models.registry import ModelRegistry
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(model_path=drafts[0], device="cpu", dtype="float32", attention_backend="torch_native",
                      disable_cuda_graph=True, skip_tokenizer_init=True, log_level="error", mem_fraction_static=0.1)
    args.resolve_once()
    _set_envs_and_config(args)
    publish(args, role="scheduler", ranks=SpawnRanks(world_rank=0, gpu_id=0))
    init_parallel_runtime(server_args=args, device="cpu", dist_port=_port())
    results = []
    for draft in drafts:
        config = ModelConfig.from_server_args(args, model_path=draft, is_draft_model=True)
        cls, _ = ModelRegistry.resolve_model_cls(config.hf_config.architectures)
        original, trackers = cls.load_weights, []

        def load_weights(self, weights, original=original, trackers=trackers):
            tracker = Tracker(self, lambda m: {"hot_token_id": None if getattr(m, "hot_token_id", None) is None
                                               else int(m.hot_token_id.numel())})
            trackers.append(tracker)
            return original(self, tracker.wrap(weights))

        cls.load_weights = load_weights
        try:
            with torch.no_grad():
                get_model(model_config=config, load_config=LoadConfig(load_format="auto"),
                          device_config=DeviceConfig("cpu"))
        finally:
            cls.load_weights = original
        results.append({"class": cls.__name__, **trackers[0].result()})
    result.write_text(json.dumps(results))

if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
