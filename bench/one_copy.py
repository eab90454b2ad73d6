"""The data path's bytes and read speed: a full speculators export against a reference export (`--states reference`).

    .venv/bin/python bench/one_copy.py [--tokens 65536] [--samples 48] [--repeats 3] [--model smollm2] [--work DIR]

For each case, a run, its full export and its reference export (speculators layout, verification off):
- `<model>`: a real run of the model group (HF engine, bf16, the bundled conversations, --samples of them; SmolLM2
  captures no bN, so the exports derive it: --last final_norm);
- `kimi-bf16`, `kimi-fp8`: synthetic runs at Kimi-K2.5's width (7168 x 5 points: b0, b3, b31, b59, bN of a 61-layer
  model; random states, --tokens tokens in samples of 256-2048), stored as captured and in float8_e4m3fn;
- `kimi-norm`: the same with the Kimi recipe's own points (its last final_norm, which is what SGLang captures: the
  exports derive the last slot, --last final_norm, the reference export on every read).
Bytes on disk (sum of file sizes) of the run, the full export and the reference export, against the floor: the tokens
the trainer reads x its slots x the width x 2 bytes (bf16, what it is handed). Goals: run + reference <= 1.02 x the run;
fp8 run + reference <= 0.3 x (bf16 run + full export), today's path.

Read speed (samples/s) in speculators' environment, one process, the same samples in order, rounds alternating:
speculators' own dataset (`ArrowDataset[i]`, what its data loader's workers call) with its `FileTransfer` on the
full export against the same with the `pipeline-run` backend on the reference export, every value then summed
(`sample`), and speculators' own training data loader over each (`loader`: its batch sampler, its collate into
8192-token batches, the eagle3 shift; no workers), bench/one_copy_read.py; both from the page cache after the first
round. Goal: reference >= 0.9 x full. The last line reads
`one_copy: ref_bytes_ratio=R read_ratio=S loader_ratio=L fp8_total_ratio=F` (S and L: the lowest case's).
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

KIMI_POINTS, KIMI_HIDDEN, KIMI_LAYERS = ["b0", "b3", "b31", "b59", "b61"], 7168, 61
SPECULATORS = REPO / ".venv-speculators" / "bin" / "python"
GOALS = {"ref_bytes_ratio": 1.02, "read_ratio": 0.9, "fp8_total_ratio": 0.3}


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def checkpoint(where: Path):
    """The final norm of a Kimi-width checkpoint (all `--last final_norm` reads of it): config.json and the weight."""
    import torch
    from safetensors.torch import save_file

    from pipeline.models.checkpoint import CheckpointTensors

    where.mkdir(parents=True, exist_ok=True)
    (where / "config.json").write_text(json.dumps({"model_type": "deepseek_v3", "hidden_size": KIMI_HIDDEN,
                                                   "num_hidden_layers": KIMI_LAYERS, "rms_norm_eps": 1e-6}))
    weight = torch.rand(KIMI_HIDDEN, generator=torch.Generator().manual_seed(1)) + 0.5
    save_file({"model.norm.weight": weight.to(torch.bfloat16)}, str(where / "model.safetensors"))
    return CheckpointTensors(where)


def synthetic_run(run: Path, num_tokens: int, storage_dtype: str | None, final_norm: bool = False) -> None:
    """A finished run of random bf16 states at Kimi's width (manifest as extract writes it, attestation left out);
    with `final_norm`, the Kimi recipe's points (its last one final_norm: SGLang captures no bN), made by the norm of
    a checkpoint written beside the run."""
    import torch
    from common import synthetic_samples

    from pipeline.core.contracts import Capture
    from pipeline.shards import layout
    from pipeline.shards.manifest import write_manifest
    from pipeline.shards.plan import plan_units
    from pipeline.shards.storage import run_record
    from pipeline.shards.writer import write_shard

    gen = torch.Generator().manual_seed(0)
    points, norm = (KIMI_POINTS[:-1] + ["final_norm"], checkpoint(run.parent / f"{run.name}-model")) if final_norm \
        else (KIMI_POINTS, None)

    def states(num: int) -> torch.Tensor:
        x = torch.randn(num, len(points), KIMI_HIDDEN, generator=gen)
        if norm is not None:
            x[:, -1] = norm.final_norm(x[:, -1] * 30)
        return x.to(torch.bfloat16)

    samples = synthetic_samples(num_tokens, vocab=150_000)
    entries = []
    for index, unit in enumerate(plan_units(samples, max_tokens_per_shard=16384, max_samples_per_shard=4096)):
        items = [(s, Capture(sample_id=s.sample_id, input_ids_T=s.input_ids_T, hidden_states_TPH=states(s.num_tokens)))
                 for s in unit]
        entries.append(write_shard(run, index, items, points=points, storage_dtype=storage_dtype,
                                   metadata={"engine": "bench"}))
    tokens = sum(e.num_tokens for e in entries)
    write_manifest(run, {
        "format_version": layout.FORMAT_VERSION, "points": points, "hidden_size": KIMI_HIDDEN,
        "dtype": "bfloat16", "shards": [e.to_dict() for e in entries],
        "num_samples": sum(e.num_samples for e in entries), "num_tokens": tokens,
        "num_loss_tokens": sum(e.num_loss_tokens for e in entries), "num_truncated": 0,
        "storage": run_record([e.storage for e in entries], points, hidden_size=KIMI_HIDDEN, num_tokens=tokens,
                              shard_bytes=sum(f["bytes"] for e in entries for f in e.files.values())),
        "rejects": {"total": 0, "by_reason": {}, "files": []},
        "provenance": {"model": {"model_type": "deepseek_v3", "num_layers": KIMI_LAYERS,
                                 "path": str(norm.path) if norm is not None else None}}})


def model_run(run: Path, model: str, samples: int) -> None:
    done = subprocess.run([sys.executable, "-m", "pipeline.extract", f"model={model}", f"data.limit={samples}",
                           "gate.mode=off", f"out_dir={run}", f"hydra.run.dir={run.parent / 'logs'}"],
                          cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"extract of {model} failed:\n{done.stderr[-3000:]}")


def exports(run: Path, work: Path) -> tuple[Path, Path, int, float]:
    """(full, reference, slots, seconds the reference export took) of `run`, verification off (the bench measures the
    data path, not verify)."""
    from pipeline.exports.driver import export_run
    from pipeline.exports.formats import exporter_for
    from pipeline.shards.manifest import read_manifest

    manifest = read_manifest(run)
    num_layers = manifest["provenance"]["model"]["num_layers"]
    last = None if f"b{num_layers}" in manifest["points"] else "final_norm"
    full, ref = work / f"{run.name}-full", work / f"{run.name}-ref"
    result = export_run(run, full, exporter_for("speculators"), last=last, verify=False)
    start = time.perf_counter()
    export_run(run, ref, exporter_for("speculators"), last=last, verify=False, states="reference")
    return full, ref, len(result.plan.points), time.perf_counter() - start


def read_speed(full: Path, ref: Path, repeats: int) -> dict[str, list[float]]:
    done = subprocess.run([str(SPECULATORS), str(REPO / "bench" / "one_copy_read.py"), str(full), str(ref),
                           str(repeats)], cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the read rounds failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=65536, help="tokens of each synthetic Kimi-width run")
    ap.add_argument("--samples", type=int, default=48, help="conversations of the real model's run")
    ap.add_argument("--model", default="smollm2", help="the real model's group (conf/model/)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--work", default=None, help="directory for the runs and exports (default: a temp dir)")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="one-copy-"))
    work.mkdir(parents=True, exist_ok=True)
    rows, figures = [], {}
    try:
        for case in (args.model, "kimi-bf16", "kimi-fp8", "kimi-norm"):
            run = work / case
            if case == args.model:
                model_run(run, args.model, args.samples)
            else:
                synthetic_run(run, args.tokens, "float8_e4m3fn" if case == "kimi-fp8" else None,
                              final_norm=case == "kimi-norm")
            full, ref, slots, seconds = exports(run, work)
            manifest = json.loads((run / "manifest.json").read_text())
            floor = manifest["num_tokens"] * slots * manifest["hidden_size"] * 2
            rows.append((case, du(run), du(full), du(ref), floor, seconds))
            if case != "kimi-fp8":
                speed = read_speed(full, ref, args.repeats)
                figures[case] = {measure: (max(speed[f"{prefix}full"]), max(speed[f"{prefix}ref"]),
                                           statistics.median(r / f for f, r in zip(speed[f"{prefix}full"],
                                                                                   speed[f"{prefix}ref"])))
                                 for measure, prefix in (("sample", ""), ("loader", "loader_"))}
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    report(rows, figures)


def report(rows, figures) -> None:
    mb = 1e6
    print(f"{'case':<12} {'run MB':>10} {'full MB':>10} {'ref MB':>9} {'floor MB':>10} {'(run+ref)/run':>14} "
          f"{'(run+full)/run':>15} {'run/floor':>10} {'ref export s':>13}")
    for case, run, full, ref, floor, seconds in rows:
        print(f"{case:<12} {run / mb:>10.1f} {full / mb:>10.1f} {ref / mb:>9.3f} {floor / mb:>10.1f} "
              f"{(run + ref) / run:>14.4f} {(run + full) / run:>15.3f} {run / floor:>10.3f} {seconds:>13.2f}")
    for case, measures in figures.items():
        for measure, (full, ref, ratio) in measures.items():
            print(f"read {case} ({measure}): full export (FileTransfer) {full:.1f} samples/s, reference "
                  f"(pipeline-run) {ref:.1f} samples/s, best of each; median per-round ratio {ratio:.3f}")
    by = {r[0]: r for r in rows}
    ref_ratio = max((run + ref) / run for _, run, _, ref, _, _ in rows)
    bf16, fp8 = by["kimi-bf16"], by["kimi-fp8"]
    fp8_total = (fp8[1] + fp8[3]) / (bf16[1] + bf16[2])
    read, loader = (min(m[measure][2] for m in figures.values()) for measure in ("sample", "loader"))
    print(f"goals: ref_bytes_ratio <= {GOALS['ref_bytes_ratio']}, read_ratio and loader_ratio >= "
          f"{GOALS['read_ratio']}, fp8_total_ratio <= {GOALS['fp8_total_ratio']}")
    print(f"one_copy: ref_bytes_ratio={ref_ratio:.4f} read_ratio={read:.3f} loader_ratio={loader:.3f} "
          f"fp8_total_ratio={fp8_total:.3f}")


if __name__ == "__main__":
    main()
