"""The real serving path, `sglang.Engine.generate`, as a small line-protocol process (bench and cross-checks).

    SGLANG_USE_CPU_ENGINE=1 .venv-sglang/bin/python bench/sglang_serving.py --model DIR --requests FILE

`--requests` is a safetensors file with `input_ids` (all prompts concatenated) and `offsets` ([n+1]). The process
starts one Engine (radix cache off, sleeping when idle, max_new_tokens=1; `--hidden-states` enables
return_hidden_states, `--aux-ids 0,1,4` eagle3 aux capture), prints `{"ready": ...}`, then answers each stdin line:
- `time`: generate over all prompts, print `{"seconds": s, "tokens": t}` (plain prefill, nothing returned but the token);
- `hidden OUT`: generate with return_hidden_states=True, save every prompt's returned states to OUT (`hs/{i}`, made
  from the lists SGLang returns: post-norm [T, H], or with aux capture the packed aux states [T, H*k]), print
  `{"seconds": s, "to_tensor_seconds": c, ...}`;
- `quit` (or end of input).
The CPU compatibility layer is activated at import time, on purpose: `sglang.Engine` spawns its scheduler, which
re-imports this main module before it imports SGLang, and must see the layer too.
"""
from __future__ import annotations

from pipeline.engines.sglang import cpu as sglang_cpu

sglang_cpu.activate_if_cpu_engine()  # module level: the spawned scheduler runs this line too

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

_replies = None  # the real stdout; fd 1 itself is pointed at stderr for SGLang and its child processes


def _engine(args: argparse.Namespace):
    import sglang

    cpu = sglang_cpu.cpu_engine_requested()
    extra = {"device": "cpu", "attention_backend": "torch_native"} if cpu else {}
    if args.mem_fraction_static is not None:
        extra["mem_fraction_static"] = args.mem_fraction_static
    if args.aux_ids:  # responses then carry the packed aux states in place of the post-norm ones
        extra.update(enable_return_aux_hidden_states=True, speculative_algorithm="EAGLE3",
                     return_aux_hidden_state_layer_ids=[int(i) for i in args.aux_ids.split(",")])
    return sglang.Engine(model_path=args.model, dtype=args.dtype, disable_radix_cache=True, disable_cuda_graph=True,
                         skip_tokenizer_init=True, max_total_tokens=args.max_total_tokens, log_level="warning",
                         sleep_on_idle=True,  # an idle scheduler otherwise busy-polls a whole core
                         enable_return_hidden_states=args.hidden_states, **extra)


def _prompts(path: str) -> list[list[int]]:
    from safetensors.torch import load_file

    data = load_file(path)
    ids, offsets = data["input_ids"].tolist(), data["offsets"].tolist()
    return [ids[a:b] for a, b in zip(offsets[:-1], offsets[1:])]


def _generate(engine, prompts: list[list[int]], hidden: bool) -> tuple[float, list]:
    start = time.perf_counter()
    outs = engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": 1, "temperature": 0},
                           return_hidden_states=hidden)
    return time.perf_counter() - start, outs


def _save_hidden(outs: list, path: str) -> float:
    """Lists -> tensors (timed: it is part of what this path costs) -> safetensors."""
    import torch
    from safetensors.torch import save_file

    start = time.perf_counter()
    tensors = {f"hs/{i}": torch.tensor(o["meta_info"]["hidden_states"][0]) for i, o in enumerate(outs)}
    seconds = time.perf_counter() - start
    save_file(tensors, path)
    return seconds


def _reply(obj: dict) -> None:
    _replies.write(json.dumps(obj) + "\n")
    _replies.flush()


def serve(args: argparse.Namespace) -> None:
    prompts = _prompts(args.requests)
    tokens = sum(len(p) for p in prompts)
    start = time.perf_counter()
    engine = _engine(args)
    _generate(engine, prompts[:4], args.hidden_states or bool(args.aux_ids))  # warm-up: one-off compilations
    _reply({"ready": True, "start_seconds": time.perf_counter() - start, "prompts": len(prompts), "tokens": tokens})
    try:
        for line in sys.stdin:
            cmd, *rest = line.split()
            if cmd == "quit":
                break
            seconds, outs = _generate(engine, prompts, hidden=(cmd == "hidden"))
            reply = {"seconds": seconds, "tokens": tokens}
            if cmd == "hidden":
                reply["to_tensor_seconds"] = _save_hidden(outs, rest[0])
            _reply(reply)
    finally:
        engine.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--requests", required=True)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--hidden-states", action="store_true", help="enable_return_hidden_states")
    ap.add_argument("--aux-ids", default="", help="comma-separated return_aux_hidden_state_layer_ids")
    ap.add_argument("--max-total-tokens", type=int, default=32768)
    ap.add_argument("--mem-fraction-static", type=float, default=None)
    args = ap.parse_args()
    global _replies
    _replies = os.fdopen(os.dup(1), "w")  # not inherited: os.dup makes non-inheritable descriptors
    os.dup2(2, 1)  # SGLang's prints, and its spawned processes', must not mix with the replies
    serve(args)


if __name__ == "__main__":
    main()
