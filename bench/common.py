"""What the engine throughput benches share: the same prompts, and the pipeline's capture stage as extract runs it."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The benches' own engines (bench/timed_engines.py) are imported as `bench.*` here and in the engine workers, which
# start from the working directory: both resolve from the repository root.
sys.path.insert(0, str(REPO))
os.chdir(REPO)
BUNDLED = REPO / "pipeline" / "data" / "bundled" / "conversations.jsonl"


def prepared_samples(model_path: Path, copies: int, work: Path, limit: int | None = None):
    """The bundled conversations, `copies` times (the first `limit` of them when given), prepared with the model's own
    tokenizer."""
    from pipeline.data.prepare import prepare
    from pipeline.data.remote_code import load_tokenizer

    lines = [line for line in BUNDLED.read_text().splitlines() if line.strip()]
    data = work / "prompts.jsonl"
    data.write_text("\n".join(lines * copies) + "\n")
    tokenizer = load_tokenizer(model_path, trust_remote_code=True)  # the benches' models are the project's own
    return prepare(data, tokenizer, max_length=2048, length_policy="truncate", limit=limit).samples


def synthetic_samples(num_tokens: int, seed: int = 0, vocab: int = 160_000):
    """Prepared samples of random ids (256..2048 tokens each, half of them trained) adding up to `num_tokens`."""
    import numpy as np

    from pipeline.core.contracts import PreparedSample

    rng = np.random.default_rng(seed)
    samples, total = [], 0
    while total < num_tokens:
        n = int(min(rng.integers(256, 2048), num_tokens - total))
        ids = rng.integers(0, vocab, n, dtype=np.int64)
        samples.append(PreparedSample(sample_id=f"s{len(samples):07d}", source="bench.jsonl", row=len(samples),
                                      input_ids_T=ids, loss_mask_T=(rng.random(n) < 0.5).astype(np.uint8)))
        total += n
    return samples


def capture_and_write(engine, samples, settings, run_dir: Path, tokens_per_shard: int, overlap: bool) -> float:
    """Seconds for the capture stage over `samples` as extract's local runner runs it (with `overlap`, unit k is
    written while unit k+1 is captured: runner.overlap_writes); any reject fails the bench."""
    from pipeline.run.capture import CaptureStage
    from pipeline.run.contract import run_units
    from pipeline.shards.plan import plan_units

    stage = CaptureStage(engine=engine, settings=settings)
    units = plan_units(samples, max_tokens_per_shard=tokens_per_shard, max_samples_per_shard=1024)

    def check(result) -> None:
        if result.rejects:
            raise SystemExit(f"unit {result.index}: {len(result.rejects)} rejected, first: "
                             f"{result.rejects[0].detail}")

    start = time.perf_counter()
    run_units(stage, run_dir, enumerate(units), check, overlap=overlap)
    return time.perf_counter() - start
