"""SGLang plain prefill vs capture+write through the pipeline, same prompts, one run (a script, not a test).

    .venv/bin/python bench/sglang_throughput.py [--model tiny-kimi-bf16] [--dtype auto] [--copies 1] [--repeats 3]
                                                [--limit N] [--lists]

Plain prefill: the real serving path, `sglang.Engine.generate(max_new_tokens=1)` over all prompts at once, no capture
(`bench/sglang_serving.py`, its own process). Capture+write: the pipeline's capture stage through
`make_engine` (SGLang's model runner in the engine's worker, aux capture + final norm + embedding, transfer
to this process, validation, safetensors + parquet shard writes; in units of
--tokens-per-shard, one after the other: runner.overlap_writes=false, the default). Runner forward: the same runner's forwards alone
(`engine.call("forward_seconds")`: aux capture included, nothing transferred or written), which isolates the
pipeline's own overhead. All are started once and kept alive (the Engine sleeps when idle); rounds alternate between
them (this machine's CPUs are shared), best of --repeats. Target: capture+write / Engine plain prefill >= 0.9.
--lists also times the alternative: the same Engine with aux capture, `return_hidden_states=True`, lists -> tensors.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from common import capture_and_write, prepared_samples

from pipeline.factory.tiny import RECIPES


def runner_forward_seconds(engine, samples, batch_size: int) -> float:
    """The runner's forwards alone (aux capture included, nothing moved out), batched as the capture stage does."""
    ordered = sorted(samples, key=lambda s: s.num_tokens)
    batches = [ordered[i: i + batch_size] for i in range(0, len(ordered), batch_size)]
    return sum(engine.call("forward_seconds", [s.input_ids_T.tolist() for s in b]) for b in batches)


def lists_round(path: Path, dtype: str, prompts, aux_ids) -> None:
    from bench.sglang_serving_client import ServingEngine

    tokens = sum(len(p) for p in prompts)
    with ServingEngine(str(path), prompts, dtype=dtype, aux_ids=aux_ids) as served:
        plain, (reply, _) = served.time_prefill(), served.hidden_states()
    print(f"Engine with aux capture {aux_ids}: plain prefill {tokens / plain['seconds']:.0f} tok/s | "
          f"return_hidden_states (lists) {tokens / reply['seconds']:.0f} tok/s + lists->tensors "
          f"{reply['to_tensor_seconds']:.2f} s; ratio {plain['seconds'] / reply['seconds']:.2f} "
          f"(without the final norm: a second pass would be needed for it)")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-kimi-bf16", choices=sorted(RECIPES),
                    help="a model recipe of pipeline.factory, built on first use: a tiny one, or the real "
                         "smollm2-135m-instruct (model=smollm2)")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--copies", type=int, default=1, help="copies of the bundled conversations")
    ap.add_argument("--limit", type=int, default=None, help="only the first N prompts (a real model is slow on CPU)")
    ap.add_argument("--batch-size", type=int, default=64, help="engine.batch_size of the pipeline")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens-per-shard", type=int, default=4096, help="runner.max_tokens_per_shard")
    ap.add_argument("--lists", action="store_true", help="also time Engine + return_hidden_states (Python lists)")
    return ap.parse_args()


def alternate(args, path: Path, info, samples, work: Path) -> tuple[dict[str, list[float]], list[int]]:
    """Seconds per repeat of each path, all three engines alive; and the aux ids the pipeline used."""
    from bench.sglang_serving_client import ServingEngine
    from bench.timed_engines import register_timed_engines
    from pipeline.core.contracts import EngineSpec
    from pipeline.engines.registry import make_engine
    from pipeline.points import parse_points
    from pipeline.run.capture import StageSettings

    n, tokens = info.num_layers, sum(s.num_tokens for s in samples)
    points = parse_points(["embed", 1, n // 2, n - 1, "final_norm"], num_layers=n)  # bN: not capturable in SGLang
    settings = StageSettings(points=points, hidden_size=info.hidden_size, batch_size=args.batch_size,
                             storage_dtype=None, metadata={"bench": "sglang_throughput"})
    print(f"model {args.model} (dtype {args.dtype}), {len(samples)} prompts, {tokens} tokens, "
          f"points {[p.label for p in points]}, pipeline batch size {args.batch_size}")
    register_timed_engines()
    spec = EngineSpec(name="sglang-timed", dtype=args.dtype)
    seconds: dict[str, list[float]] = {"Engine plain prefill": [], "runner forward": [], "capture+write": []}
    with ServingEngine(str(path), [s.input_ids_T for s in samples], dtype=args.dtype) as served, \
            make_engine(spec, model_path=str(path), points=points, num_layers=n) as engine:
        engine.capture(samples[:8])  # warm-up (the Engine warmed up before reporting ready)
        paths = {"Engine plain prefill": lambda r: served.time_prefill()["seconds"],
                 "runner forward": lambda r: runner_forward_seconds(engine, samples, args.batch_size),
                 "capture+write": lambda r: capture_and_write(engine, samples, settings, work / f"run-{r}",
                                                              args.tokens_per_shard, overlap=False)}
        names = list(paths)
        for r in range(args.repeats):
            for name in names[r % len(names):] + names[:r % len(names)]:  # rotated: the machine's load drifts
                seconds[name].append(paths[name](r))
            print(f"repeat {r}: " + " | ".join(f"{k} {tokens / v[-1]:6.0f} tok/s ({v[-1]:.2f} s)"
                                               for k, v in seconds.items()))
        return seconds, engine.info().extra["aux_layer_ids"]


def main() -> None:
    args = parse_args()
    from pipeline.models.info import read_model_info
    from pipeline.factory.tiny import ensure_model

    path = ensure_model(args.model)
    info = read_model_info(path)
    with tempfile.TemporaryDirectory() as tmp:
        samples = prepared_samples(path, args.copies, Path(tmp), args.limit)
        seconds, aux_ids = alternate(args, path, info, samples, Path(tmp))
        if args.lists:
            lists_round(path, args.dtype, [s.input_ids_T for s in samples], aux_ids)
    report(sum(s.num_tokens for s in samples), seconds)


def report(tokens: int, seconds: dict[str, list[float]]) -> None:
    """Best of the repeats, and the median of per-repeat ratios (adjacent rounds share the machine's load)."""
    best = {k: tokens / min(v) for k, v in seconds.items()}
    print("best: " + ", ".join(f"{k} {v:.0f} tok/s" for k, v in best.items()))
    plain, forward, piped = (seconds[k] for k in ("Engine plain prefill", "runner forward", "capture+write"))
    per_repeat = sorted(p / c for p, c in zip(plain, piped))
    print(f"ratio capture+write / Engine plain prefill: best-of {best['capture+write'] / best['Engine plain prefill']:.3f}"
          f", median per repeat {statistics.median(per_repeat):.3f} (target >= 0.9)")
    print(f"ratio capture+write / runner forward (the pipeline's own overhead): best-of "
          f"{best['capture+write'] / best['runner forward']:.3f}, median per repeat "
          f"{statistics.median(f / c for f, c in zip(forward, piped)):.3f}")


if __name__ == "__main__":
    main()
