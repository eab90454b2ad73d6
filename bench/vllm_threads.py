"""vLLM-CPU's thread binding: capture+write throughput under each setting, side by side in one run (not a test).

    .venv/bin/python bench/vllm_threads.py [--model smollm2-135m-instruct] [--dtype bfloat16] [--copies 1] [--limit N]
                                           [--repeats 3] [--plain] [--settings default,own:auto,own:0-1,own:nobind]

vLLM on CPU binds its compute threads itself, but only where its multiprocessing executor starts the model's worker
(the EngineCore in a process of its own): `VLLM_CPU_OMP_THREADS_BIND` (default `auto`: one thread per physical core
of the first NUMA node, minus `VLLM_CPU_NUM_OF_RESERVED_CPU`, at least one core, kept for the scheduler process; on a
2-core machine that leaves one) sets OMP_NUM_THREADS / OMP_PLACES / OMP_PROC_BIND for that worker; `nobind` leaves
them alone; a CPU list (`0-1`) binds to those CPUs. With the EngineCore in the adapter's process (the adapter's default
for text models) the worker is the adapter's process and nothing is bound: torch's own thread count.

A setting is `default` (the adapter as it is: EngineCore where the adapter puts it, nothing set), `in:tN` (EngineCore
in the adapter's process, OMP_NUM_THREADS=N: torch's threads, unbound) or `own:BIND` (EngineCore in its own process,
VLLM_CPU_OMP_THREADS_BIND=BIND; append `/rN` for VLLM_CPU_NUM_OF_RESERVED_CPU=N). Each setting gets its own engine
(started once, all kept alive; an idle vLLM engine sleeps); every repeat runs capture+write (the capture stage as
extract runs it) on each engine (with --plain, plain prefill too), in rotated order. Printed: the threads each
engine's model really computes on (its worker's provenance), tok/s best and median per setting, and each setting's
median per-repeat ratio to the first setting. Figures: docs/engines.md#vllm-cpu-threads.
"""
from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from statistics import median

from common import capture_and_write, prepared_samples

from pipeline.factory.tiny import RECIPES

_ENV = ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU", "OMP_NUM_THREADS")


def parse_setting(text: str) -> tuple[dict, dict[str, str]]:
    """(engine.options, environment) of one setting."""
    if text == "default":
        return {}, {}
    where, _, bind = text.partition(":")
    if where == "in" and bind.startswith("t") and bind[1:].isdigit():
        return {"engine_core_process": False}, {"OMP_NUM_THREADS": bind[1:]}
    if where != "own" or not bind:
        raise SystemExit(f"--settings: {text!r} is not default, in:tN or own:BIND")
    bind, _, reserved = bind.partition("/r")
    env = {"VLLM_CPU_OMP_THREADS_BIND": bind} | ({"VLLM_CPU_NUM_OF_RESERVED_CPU": reserved} if reserved else {})
    return {"engine_core_process": True}, env


def start_engine(model: str, dtype: str, options: dict, env: dict[str, str], path: Path, info, points, longest: int):
    """An engine whose worker (and vLLM's, which inherits it) sees `env`; this process's environment is restored."""
    from pipeline.core.contracts import EngineSpec
    from pipeline.engines.registry import make_engine

    saved = {k: os.environ.get(k) for k in _ENV}
    for k in _ENV:
        os.environ.pop(k, None)
    os.environ.update(env)
    try:
        engine = make_engine(EngineSpec(name="vllm-timed", dtype=dtype, options=options), model_path=str(path),
                             points=points, num_layers=info.num_layers, max_seq_len=longest)
        try:
            engine.start()
        except BaseException:
            engine.close()  # its worker, if it started
            raise
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return engine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", choices=sorted(RECIPES),
                    help="a model recipe of pipeline.factory, built on first use")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--copies", type=int, default=1, help="copies of the bundled conversations")
    ap.add_argument("--limit", type=int, default=None, help="only the first N prompts (a real model is slow on CPU)")
    ap.add_argument("--batch-size", type=int, default=64, help="engine.batch_size of the pipeline")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens-per-shard", type=int, default=16384, help="runner.max_tokens_per_shard")
    ap.add_argument("--plain", action="store_true", help="also time plain prefill (LLM.generate) per setting")
    ap.add_argument("--settings", default="default,own:auto,own:0-1,own:nobind",
                    help="comma-separated: default, in:tN, own:BIND (BIND: auto, nobind or a CPU list; /rN)")
    args = ap.parse_args()

    from bench.timed_engines import register_timed_engines
    from pipeline.factory.tiny import ensure_model
    from pipeline.models.info import read_model_info
    from pipeline.points import parse_points
    from pipeline.run.capture import StageSettings

    settings_ = {name: parse_setting(name) for name in args.settings.split(",")}
    path = ensure_model(args.model)
    info = read_model_info(path)
    points = parse_points(["embed", 1, info.num_layers // 2, "last", "final_norm"], num_layers=info.num_layers)
    register_timed_engines()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        samples = prepared_samples(path, args.copies, work, args.limit)
        tokens = sum(s.num_tokens for s in samples)
        prompts = [s.input_ids_T.tolist() for s in samples]
        stage = StageSettings(points=points, hidden_size=info.hidden_size, batch_size=args.batch_size,
                              storage_dtype=None, metadata={"bench": "vllm_threads"})
        print(f"model {args.model} ({args.dtype}), {len(samples)} prompts, {tokens} tokens, {os.cpu_count()} CPUs")
        engines = {}
        try:
            for name, (options, env) in settings_.items():
                engines[name] = start_engine(args.model, args.dtype, options, env, path, info, points,
                                             max(s.num_tokens for s in samples))
                extra = engines[name].info().extra
                print(f"{name}: EngineCore {extra['engine_core']}, threads {extra['threads']}")
                engines[name].call("plain_prefill_seconds", prompts[:8])  # warm-up
                engines[name].capture(samples[:8])
            seconds = {(name, kind): [] for name in engines for kind in ("capture+write", "plain prefill")
                       if kind == "capture+write" or args.plain}
            runs = list(seconds)
            for r in range(args.repeats):
                for name, kind in runs[r % len(runs):] + runs[:r % len(runs)]:  # rotated: the load drifts
                    engine = engines[name]
                    seconds[name, kind].append(
                        capture_and_write(engine, samples, stage, work / f"run-{r}-{runs.index((name, kind))}",
                                          args.tokens_per_shard, overlap=False)
                        if kind == "capture+write" else engine.call("plain_prefill_seconds", prompts))
                print(f"repeat {r}: " + " | ".join(f"{n} {k} {tokens / v[-1]:.0f}" for (n, k), v in seconds.items())
                      + f" tok/s; load {os.getloadavg()[0]:.1f}")
        finally:
            for engine in engines.values():
                engine.close()
    first = next(iter(engines))
    for (name, kind), times in seconds.items():
        ref = seconds[first, kind]
        print(f"{name} {kind}: best {tokens / min(times):.0f} tok/s, median {tokens / median(times):.0f} tok/s; "
              f"to {first}: median per repeat {median(r / t for r, t in zip(ref, times)):.3f}")


if __name__ == "__main__":
    main()
