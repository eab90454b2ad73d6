"""Ray runner with one actor vs the local runner, same data, same invocation (not a test: run by hand).

    .venv/bin/python bench/ray_vs_local.py [--copies 2] [--repeats 2]

Throughput is taken over the capture phase (units captured, validated and written), which is where the runners
differ; engine start and Ray's own start are printed beside it. The actor is given every CPU, as the local runner
has them: Ray sets OMP_NUM_THREADS to an actor's num_cpus, so the default cpus_per_replica=1 would halve a CPU
engine's threads here. Target: Ray / local >= 0.9.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from hydra import compose, initialize_config_dir

from pipeline.config import register_configs
from pipeline.run.job import run_extract

REPO = Path(__file__).resolve().parents[1]
BUNDLED = REPO / "pipeline" / "data" / "bundled" / "conversations.jsonl"


def run(runner: str, data: Path, out: Path):
    extra = [f"runner.cpus_per_replica={os.cpu_count()}"] if runner == "ray" else []
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            f"runner={runner}", f"data.path={data}", f"out_dir={out}", "runner.max_tokens_per_shard=4096",
            "gate.mode=off", *extra])
    return run_extract(cfg)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=2, help="copies of the bundled conversations")
    ap.add_argument("--repeats", type=int, default=2, help="interleaved runs per runner (best is kept)")
    args = ap.parse_args()
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    register_configs()
    best: dict[str, tuple[float, float]] = {}
    rates: dict[str, list[float]] = {"local": [], "ray": []}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data.jsonl"
        data.write_text((BUNDLED.read_text().rstrip("\n") + "\n") * args.copies)
        for i in range(args.repeats):
            for runner in ("local", "ray"):
                s = run(runner, data, Path(tmp) / f"{runner}-{i}")
                rate = s.num_tokens / s.capture_seconds
                rates[runner].append(rate)
                if rate > best.get(runner, (0.0, 0.0))[0]:
                    best[runner] = (rate, s.seconds - s.capture_seconds)
                print(f"{runner:>5} run {i}: {s.num_tokens} tokens, capture {rate:8.0f} tok/s, "
                      f"start+prepare {s.seconds - s.capture_seconds:5.1f}s")
    print(f"best capture throughput: local {best['local'][0]:.0f} tok/s, ray (1 actor) {best['ray'][0]:.0f} tok/s; "
          f"ratio ray/local = {best['ray'][0] / best['local'][0]:.2f}; median of per-round ratios "
          f"{statistics.median(r / l for r, l in zip(rates['ray'], rates['local'])):.2f}")


if __name__ == "__main__":
    main()
