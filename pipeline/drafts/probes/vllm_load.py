"""Run by .venv-vllm/bin/python: load a draft into vLLM's own EAGLE-3 draft class with vLLM's own model loader on CPU.

    python vllm_load.py RESULT_JSON TARGET_DIR DRAFT_DIR [DRAFT_DIR ...]

vLLM builds a draft class only inside a speculative config over a target (`Eagle3LlamaForCausalLM(vllm_config=...)`
reads the target's layer count and vocabulary), so the target's directory is needed (its config; no target weight is
read). For each draft: `EngineArgs(model=TARGET, speculative_config={"method": "eagle3", "model": DRAFT, ...})
.create_engine_config()`, parallel groups of one rank (gloo), then `vllm.model_executor.model_loader.get_model` with
the draft's model config, which builds the class vLLM picks and feeds it the checkpoint through its own
`load_weights`, watched by `track.Tracker`. A load vLLM refuses is reported with its error.
"""
from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from pipeline.drafts.probes.track import Tracker  # noqa: E402


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(result: Path, target: str, drafts: list[str]) -> None:
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader import get_model

    if not torch.accelerator.is_available():  # what vLLM's CPU model runner does (v1/worker/cpu_model_runner.py)
        torch.accelerator.empty_cache = lambda *args, **kwargs: None
    results, initialised = [], False
    for draft in drafts:
        args = EngineArgs(model=target, dtype="float32", enforce_eager=True, skip_tokenizer_init=True,
                          speculative_config={"method": "eagle3", "model": draft, "num_speculative_tokens": 1})
        config = args.create_engine_config()
        draft_config = config.speculative_config.draft_model_config
        with set_current_vllm_config(config):
            if not initialised:
                init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                             distributed_init_method=f"tcp://127.0.0.1:{_port()}")
                initialize_model_parallel(1, 1)
                initialised = True
            from vllm.model_executor.model_loader.utils import get_model_architecture
            cls, _ = get_model_architecture(draft_config)
            original, trackers = cls.load_weights, []

            def load_weights(self, weights, original=original, trackers=trackers):
                tracker = Tracker(self, lambda m: {})
                trackers.append(tracker)
                return original(self, tracker.wrap(weights))

            cls.load_weights = load_weights
            try:
                with torch.no_grad():
                    get_model(vllm_config=config, model_config=draft_config)
                results.append({"class": cls.__name__, **trackers[0].result()})
            except Exception as exc:  # noqa: BLE001 vLLM refusing the checkpoint is the finding, in its words
                results.append({"class": cls.__name__, "refused": f"{type(exc).__name__}: {exc}"[:600]})
            finally:
                cls.load_weights = original
    result.write_text(json.dumps(results))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3:])
