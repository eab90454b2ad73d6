"""Regeneration's generated tokens/s against the engine's own plain generate, same prompts, same engine, one run.

    .venv/bin/python bench/regen_throughput.py [--engine vllm] [--model smollm2-135m-instruct] [--dtype bfloat16]
                                               [--prompts 32] [--max-tokens 64] [--repeats 3]

Plain: the engine's own generate API called inside its worker on the prompts' token ids, all at once, greedy
(vLLM: `LLM.generate`; SGLang: `Engine.generate`). Regenerate: the regeneration stage as `pipeline.regenerate` runs it on the same started
engine (prompts rendered by the chat template, requests through the worker transport, answers parsed into the
history, the Parquet part and its marker written with sha256). Both greedy with the same stop ids, so both produce the
same tokens; alternated --repeats times; ratios of the median times per generated token, and best-of. Goal: >= 0.9.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from statistics import median

import common  # noqa: F401 - puts the repository root on sys.path (bench.*, pipeline.*)

from pipeline.factory.tiny import RECIPES

ENGINES = {"vllm": "vllm-timed", "sglang": "sglang-timed"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="vllm", choices=sorted(ENGINES))
    ap.add_argument("--model", default="smollm2-135m-instruct", choices=sorted(RECIPES))
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompts", type=int, default=32, help="the first N bundled conversations' prompts")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    from bench.timed_engines import register_timed_engines
    from pipeline.core.contracts import EngineSpec
    from pipeline.data.mask import encode_chat, turn_ids
    from pipeline.data.remote_code import load_tokenizer
    from pipeline.engines.registry import make_engine
    from pipeline.factory.tiny import ensure_model
    from pipeline.models.info import read_model_info
    from pipeline.regen.prompts import read_prompts
    from pipeline.regen.sampling import stop_token_ids
    from pipeline.regen.stage import RegenPlan

    register_timed_engines()
    model_dir = ensure_model(args.model)
    info = read_model_info(model_dir)
    trust = args.model.startswith("tiny-k")
    tokenizer = load_tokenizer(model_dir, trust)
    stop_ids, _ = stop_token_ids(model_dir, tokenizer, turn_ids(tokenizer), None)
    data = Path(__file__).resolve().parents[1] / "pipeline/data/bundled/conversations.jsonl"
    prompts = read_prompts(data, tokenizer, max_length=4096, limit=args.prompts, n=1, seed=0)
    # One turn per conversation: the record's first user turn (the plain baseline has no history to carry).
    conversations = [type(c)(**{**c.__dict__, "messages": c.messages[:next(
        i for i, m in enumerate(c.messages) if m["role"] == "assistant")]}) for c in prompts.conversations]
    ids = [encode_chat(tokenizer, list(c.messages), True, c.tools) for c in conversations]
    spec = EngineSpec(name=ENGINES[args.engine], dtype=args.dtype, batch_size=len(ids))
    engine = make_engine(spec, model_path=str(model_dir), points=[], num_layers=info.num_layers,
                         trust_remote_code=trust, max_seq_len=max(map(len, ids)) + args.max_tokens, task="generate")
    plan = RegenPlan(model_path=str(model_dir), trust_remote_code=trust,
                     sampling={"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": args.max_tokens},
                     stop_ids=stop_ids, max_length=4096, keep_truncated=True)
    plain, regen = [], []
    with engine, tempfile.TemporaryDirectory() as tmp:
        stage = plan.stage(engine)
        engine.call("plain_generate_seconds", ids[:2], 4, list(stop_ids))  # warm-up
        for repeat in range(args.repeats):
            seconds, tokens = engine.call("plain_generate_seconds", ids, args.max_tokens, list(stop_ids))
            plain.append(seconds / tokens)
            start = time.perf_counter()
            states = stage.compute(conversations)
            result = stage.write(Path(tmp), repeat, conversations, states)
            regen.append((time.perf_counter() - start) / result.generated_tokens)
            print(f"repeat {repeat}: plain {tokens:.0f} tokens {1 / plain[-1]:.1f} tok/s; regenerate "
                  f"{result.generated_tokens} tokens {1 / regen[-1]:.1f} tok/s")
    figures = {"engine": args.engine, "model": args.model, "dtype": args.dtype, "prompts": len(ids),
               "max_tokens": args.max_tokens, "plain_tok_s": 1 / median(plain), "regenerate_tok_s": 1 / median(regen),
               "ratio_medians": median(plain) / median(regen), "ratio_best": min(plain) / min(regen)}
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
