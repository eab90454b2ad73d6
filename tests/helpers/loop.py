"""The closed loop at CI size, on the real small model (SmolLM2-135M-Instruct), every step through the command line its
users run: regenerate (vLLM, float32, greedy) -> extract (HF, float32) at b2, b15, b27 and bN -> export (speculators'
layout, draft vocabulary from the export's token frequencies) -> train (speculators' own CLI on CPU) -> accept (vLLM
serving the drafts, counters from the engine) with the doctor's verdict beside each draft.

Sized to prove the wiring, not the drafter: 8 prompts, answers of at most 40 tokens, a one-layer draft trained until
it has learnt those answers (60 epochs of 256-token steps with AdamW, about 140 steps: ~100 s on 2 cores), measured
in sample (the prompts it was trained on, the first 24 tokens of each answer). A draft that learnt the target's answers
is accepted far more often than a random one; served with other aux layers ([0, 1, 2]) it loses much of that; with a
d2t past the vocabulary vLLM fails on it, and the others are measured all the same. Measured
(float32 everywhere), acceptance length at K=3: on an AMD EPYC without AVX-512, trained 2.365 (seed 0; 2.918 with
the trainer's default seed), random 1.000, the trained draft fed [0, 1, 2] 1.740 (1.673); on an AMD EPYC with
AVX-512 bf16 (same seed, in a full suite run), trained 2.738, random 1.000, fed [0, 1, 2] 1.703: the trainer's CPU
kernels differ, the margins the tests assert hold on both.

Muon (speculators' default) is avoided: its Newton-Schulz runs in bf16, emulated on CPUs without AMX (about 10 s a
step here against 0.3 s for AdamW at this size), and a step's attention cost grows with --total-seq-len, so short
steps buy the most updates for the time.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tests.helpers.cli import cli
from tests.helpers.drafts import make_draft, rewire
from tests.helpers.trainers import speculators_train

__all__ = ["ACCEPT_TOKENS", "K", "Loop", "PROMPTS", "build_loop"]

# Every prompt form accept renders: a user turn, a system turn with an earlier exchange whose answer is not part of
# the prompt, and a bare prompt; then single questions.
PROMPTS = [{"messages": [{"role": "user", "content": "What is the capital of France?"}]},
           {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Count to five."},
                         {"role": "assistant", "content": "1 2 3 4 5"}]},
           {"prompt": "Write a haiku about rain."}]
QUESTIONS = ["Explain volcanoes to a beginner in a few sentences.", "Why does the water cycle matter today?",
             "Explain baking bread to a beginner in a few sentences.",
             "Summarise the history of the human heart briefly.", "Describe a typical day involving birdwatching."]
AUX = [2, 15, 27]  # vLLM's EAGLE-3 default for 30 layers: the sidecar's serving ids for these captures
K = 3
ANSWER_TOKENS = 40
ACCEPT_TOKENS = 24
EPOCHS = 60


@dataclass(frozen=True)
class Loop:
    root: Path
    model: Path
    regen: Path
    run: Path
    export: Path
    drafts: dict[str, Path]  # served: trained, untrained, bottom3, d2t-past-vocab; only doctored: shift+1, shift-1
    accept_out: Path
    accept: subprocess.CompletedProcess
    report: dict


def _ok(done: subprocess.CompletedProcess, what: str) -> None:
    assert done.returncode == 0, f"{what} failed (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"


def _d2t_past_vocab(src: Path, dst: Path, vocab: int) -> Path:
    """The trained draft with every draft token mapped past the target's vocabulary: vLLM loads it and fails on it."""
    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    tensors["d2t"] = torch.full_like(tensors["d2t"], vocab)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def build_loop(root: Path, model: Path) -> Loop:
    root.mkdir(parents=True, exist_ok=True)
    prompts = root / "prompts.jsonl"
    records = PROMPTS + [{"messages": [{"role": "user", "content": q}]} for q in QUESTIONS]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in records))
    regen, run, export = root / "regen", root / "run", root / "export"
    _ok(cli("pipeline.regenerate", "model=smollm2", "engine=vllm", "engine.dtype=float32", f"data.path={prompts}",
            f"out_dir={regen}", f"sampling.max_tokens={ANSWER_TOKENS}", f"hydra.run.dir={root / 'logs' / 'regen'}",
            timeout=900), "regenerate")
    _ok(cli("pipeline.extract", "model=smollm2", "engine=hf", "engine.dtype=float32", "gate.mode=off",
            f"data.path={regen}", f"out_dir={run}", f"capture.points=[{','.join(map(str, AUX))},last]",
            f"hydra.run.dir={root / 'logs' / 'extract'}"), "extract")
    _ok(cli("pipeline.export", str(run), "--format", "speculators", "--out", str(export), "--draft-vocab", "1024"),
        "export")
    ckpt = root / "ckpt"
    # AdamW (see above); --checkpoint-freq keeps the first and the last epoch (85 MB each), not all 60
    train = speculators_train(model, export, ckpt, epochs=EPOCHS, total_seq_len=256, lr=3e-3,
                              extra=("--optimizer", "adamw", "--seed", "0", "--checkpoint-freq", str(EPOCHS)))
    _ok(subprocess.run(train, cwd=root, capture_output=True, text=True, timeout=900, check=False), "training")
    drafts = root / "drafts"
    trained = drafts / "trained"
    shutil.copytree(ckpt / str(EPOCHS - 1), trained)
    target = json.loads((model / "config.json").read_text())
    served = {"trained": trained,
              "untrained": make_draft(drafts / "untrained", target, schema="speculators", aux_ids=AUX),
              "bottom3": rewire(trained, drafts / "bottom3", [0, 1, 2]),
              "d2t-past-vocab": _d2t_past_vocab(trained, drafts / "d2t-past-vocab", target["vocab_size"])}
    shifted = {name: rewire(trained, drafts / name, [i + step for i in AUX])
               for name, step in (("shift+1", 1), ("shift-1", -1))}
    out = root / "accept"
    done = cli("pipeline.accept", "--serve", "vllm", "--export", str(export), "--prompts", str(prompts),
               "--out", str(out), "--num-speculative-tokens", str(K), "--max-tokens", str(ACCEPT_TOKENS),
               "--dtype", "float32", *(a for path in served.values() for a in ("--draft", str(path))), timeout=1500)
    # the draft vLLM fails on is reported beside the others, with its own exit status
    assert done.returncode == 1 and (out / "report.json").is_file(), f"accept:\n{done.stderr[-4000:]}"
    return Loop(root, model, regen, run, export, served | shifted, out, done,
                json.loads((out / "report.json").read_text()))
