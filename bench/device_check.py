"""One device check for a machine with a CUDA device (a script, not a test; its CPU half runs in the tests).

    python bench/device_check.py --device cuda --out device_check.json      # on the GPU machine, under 5 minutes
    .venv/bin/python bench/device_check.py --device cpu --out cpu.json       # the CPU half, anywhere

1. The HF reference engine (`pipeline.engines.hf`, `engine.options.device`) captures SmolLM2-135M-Instruct and the
   tiny Kimi twin at every boundary and final_norm on `--device` and on the CPU, in float32 and in bfloat16; relative
   L2 per point, device against CPU (float32 should agree within 1e-5; bf16 shows the kernels' rounding).
2. The host path at Kimi-K2.5's width (7168 x 5 points, bf16: 71,680 B per token): states made in the device's
   memory, copied to pageable host memory and (CUDA only) to pinned host memory, GB/s (10^9 B) best of --repeats.
One JSON holds every figure, the device's name and the libraries' versions. It needs torch, transformers and numpy
only (the pipeline's engine modules import nothing else): what the GPU machine's image has. The models come from
$PIPELINE_MODELS_DIR or .cache/models (built by scripts/setup.sh; copy them along).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.core.contracts import EngineSpec, PreparedSample  # noqa: E402
from pipeline.engines.registry import make_engine  # noqa: E402
from pipeline.models.info import read_model_info  # noqa: E402
from pipeline.points import parse_points  # noqa: E402

MODELS = ("smollm2-135m-instruct", "tiny-kimi-bf16")
KIMI_WIDTH, KIMI_POINTS = 7168, 5


def _samples(vocab: int, lengths=(96, 33, 160)) -> list[PreparedSample]:
    rng = np.random.default_rng(0)
    return [PreparedSample(sample_id=f"s{i}", source="device_check", row=i,
                           input_ids_T=rng.integers(0, vocab, n).astype(np.int64), loss_mask_T=np.ones(n, np.uint8))
            for i, n in enumerate(lengths)]


def _capture(path: Path, device: str, dtype: str, samples: list[PreparedSample]) -> list[torch.Tensor]:
    info = read_model_info(path)
    points = parse_points(list(range(info.num_layers + 1)) + ["final_norm"], num_layers=info.num_layers)
    spec = EngineSpec(name="hf", dtype=dtype, batch_size=len(samples), options={"device": device})
    with make_engine(spec, model_path=str(path), points=points, num_layers=info.num_layers) as engine:
        return [c.hidden_states_TPH.float() for c in engine.capture(samples)]


def _rel_l2_per_point(got: list[torch.Tensor], ref: list[torch.Tensor]) -> list[float]:
    a, b = torch.cat(got), torch.cat(ref)
    return [float(torch.linalg.vector_norm(a[:, p] - b[:, p]) / torch.linalg.vector_norm(b[:, p]))
            for p in range(a.shape[1])]


def model_figures(path: Path, device: str) -> dict:
    samples = _samples(read_model_info(path).vocab_size or 1000)
    out, kept = {}, {}
    for dtype in ("float32", "bfloat16"):
        started = time.perf_counter()
        kept[dtype] = on_device = _capture(path, device, dtype, samples)
        on_cpu = _capture(path, "cpu", dtype, samples)  # with --device cpu: a second engine, run-to-run
        errors = _rel_l2_per_point(on_device, on_cpu)
        out[dtype] = {"rel_l2_device_vs_cpu_per_point": errors, "worst": max(errors),
                      "seconds": round(time.perf_counter() - started, 2)}
    out["rel_l2_bfloat16_vs_float32_on_device_per_point"] = _rel_l2_per_point(kept["bfloat16"], kept["float32"])
    return out


def host_path(device: str, tokens: int, repeats: int) -> dict:
    """GB/s of captured states copied from the device's memory to host memory, pageable and pinned."""
    states = torch.randn(tokens, KIMI_POINTS, KIMI_WIDTH, device=device).to(torch.bfloat16)
    nbytes = states.numel() * states.element_size()
    out = {"tokens": tokens, "bytes": nbytes, "bytes_per_token": nbytes // tokens}
    targets = {"pageable": lambda: torch.empty(states.shape, dtype=states.dtype)}
    if device.startswith("cuda"):
        targets["pinned"] = lambda: torch.empty(states.shape, dtype=states.dtype, pin_memory=True)
    else:
        out["pinned"] = "not measured: pinned host memory needs a CUDA device"
    for name, make in targets.items():
        best = 0.0
        for _ in range(repeats):
            host = make()
            _sync(device)
            started = time.perf_counter()
            host.copy_(states, non_blocking=name == "pinned")
            _sync(device)
            best = max(best, nbytes / (time.perf_counter() - started) / 1e9)
        out[name] = {"gb_s_best": round(best, 3)}
    return out


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (cpu: the CPU half)")
    parser.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated model directories' names")
    parser.add_argument("--tokens", type=int, default=4096, help="tokens of Kimi-width states in the host-path copy")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: torch {torch.__version__} sees no CUDA device here")
    import transformers

    root = Path(os.environ.get("PIPELINE_MODELS_DIR", ROOT / ".cache" / "models"))
    report = {"device": args.device, "device_name": torch.cuda.get_device_name(args.device)
              if args.device.startswith("cuda") else "cpu", "torch": torch.__version__,
              "transformers": transformers.__version__, "python": sys.version.split()[0],
              "models": {name: model_figures(root / name, args.device) for name in args.models.split(",") if name},
              "host_path_kimi_width": host_path(args.device, args.tokens, args.repeats)}
    args.out.write_text(json.dumps(report, indent=2))
    for name, figures in report["models"].items():
        print(f"{name}: device vs cpu, worst relative L2 float32 {figures['float32']['worst']:.1e}, "
              f"bfloat16 {figures['bfloat16']['worst']:.1e}")
    print(f"host path at Kimi's width: {json.dumps(report['host_path_kimi_width'])}")
    print(f"device_check: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
