"""Run by .venv-vllm/bin/python: load a draft into vLLM's own EAGLE-3 draft class with vLLM's own model loader on CPU.

    python vllm_load.py RESULT_JSON TARGET_DIR DRAFT_DIR [DRAFT_DIR ...]

vLLM builds a draft class only inside a speculative config over a target (`Eagle3LlamaForCausalLM(vllm_config=...)`
reads the target's layer count and vocabulary), so the target's directory is needed (its config; no target weight is
read). For each draft: `EngineArgs(model=TARGET, speculative_config={"method": "eagle3", "model": DRAFT, ...})
.create_engine_config()`, parallel groups of one rank (gloo), then `vllm.model_executor.model_loader.get_model` with
the draft's model config, which builds the class vLLM picks and feeds it the checkpoint through its own
`load_weights`, watched by `track.Tracker`. A load vLLM refuses is reported with its error.

Then one forward step over the loaded draft, as vLLM's proposer runs it (`combine_hidden_states`, the model, then
`compute_logits`; no attention metadata, so attention computes nothing, as in vLLM's own profiling run), with every
module's entry recorded: a parameter whose module never ran is one vLLM builds but never reads (its Eagle-3 decoder
layers after the first build a `hidden_norm` that only layer 0 applies), so leaving it unset costs nothing.
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


def _unused(model, config) -> list[str]:
    """The parameters of modules that one draft step never enters (a module handed to a running one as an argument,
    the lm_head to the logits processor, counts as entered)."""
    import torch
    from vllm.forward_context import set_forward_context

    entered: set[int] = set()

    def enter(module, args):
        entered.add(id(module))
        entered.update(id(a) for a in args if isinstance(a, torch.nn.Module))

    hooks = [m.register_forward_pre_hook(enter) for m in model.modules()]
    try:
        tokens = 4
        fc = getattr(getattr(model, "model", model), "fc", None)
        width = getattr(fc, "input_size", None) or model.config.hidden_size
        with torch.no_grad(), set_forward_context(None, config):
            hidden = torch.zeros(tokens, width)
            if hasattr(model, "combine_hidden_states"):
                hidden = model.combine_hidden_states(hidden)
            out = model(torch.zeros(tokens, dtype=torch.long), torch.arange(tokens), hidden)
            model.compute_logits(out[0] if isinstance(out, tuple) else out)
    finally:
        for hook in hooks:
            hook.remove()
    return [f"{prefix}.{name}" if prefix else name for prefix, module in model.named_modules()
            if id(module) not in entered for name, _ in module.named_parameters(recurse=False)]


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
                    model = get_model(vllm_config=config, model_config=draft_config)
                results.append({"class": cls.__name__, **trackers[0].result()})
                try:
                    results[-1]["unused"] = _unused(model, config)
                except Exception as exc:  # noqa: BLE001 without the step, every unset parameter counts as read
                    results[-1]["forward_error"] = f"{type(exc).__name__}: {exc}"[:300]
            except Exception as exc:  # noqa: BLE001 vLLM refusing the checkpoint is the finding, in its words
                results.append({"class": cls.__name__, "refused": f"{type(exc).__name__}: {exc}"[:600]})
            finally:
                cls.load_weights = original
    result.write_text(json.dumps(results))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3:])
