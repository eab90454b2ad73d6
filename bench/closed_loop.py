"""The closed loop on the real small model: regenerate -> extract -> export -> train -> doctor -> accept, and one table of
acceptance figures with each draft's doctor verdict beside them.

    .venv/bin/python bench/closed_loop.py [--work bench/out/closed_loop] [--prompts 300] [--held-out 24]
        [--max-tokens 96] [--epochs 4] [--draft-vocab 8192] [--k 3] [--accept-tokens 48] [--variants all]
        [--arms embed,mask-shift,post-norm,capped-ending,original|all] [--transfer hf,vllm,sglang]

Every step is the project's own command line (or the trainer's), run as a user runs it, into --work; a step whose
result is already there (a finished regeneration, run, export, checkpoint) is not run again, so a rerun after a stop
goes on where it was, and --variants can be re-served without training again.

- Prompts: the bundled conversations' first user turns plus prompts composed from task templates and topics (no hub:
  nothing else to download), shuffled with a fixed seed; --held-out of them are never trained on and are the prompts
  acceptance is measured on (rendered through the target's chat template by pipeline.accept).
- Regenerate (vLLM, float32, greedy, --max-tokens): the target writes the answers it will be asked to draft.
- Extract (vLLM, float32) at b2, b15, b27 (vLLM's EAGLE-3 default aux ids for 30 layers) and bN, the gate against HF on.
- Export to speculators' layout with --draft-vocab (token frequencies, d2t/t2d written by the export).
- Train with speculators 0.9's own CLI through the CPU shim (tests/exports/drivers/speculators_cpu.py): one layer,
  --epochs; every epoch's checkpoint is kept, which gives the training-budget rows for free.
- Serve every draft with vLLM and measure (pipeline.accept, one call: one start per draft and a plain one), into
  --work/accept-<UTC time> (a rerun adds its own: no measurement is replaced).

Trained arms (--arms, comma-separated, or all; each is its own export of the same run, trained with the same flags,
so a row differs from `wired` in one thing only):
- `embed`: the features [embed, b2, b15] + bN (vLLM ids [0, 2, 15]), the users' story of a trainer that captured the
  embedding while the server feeds the next layers: served as trained (`embed-as-trained`) and as the server's
  default [2, 15, 27] (`embed-served-2,15,27`), measured in a call of its own whose doctor reads that export;
- `mask-shift`: the loss mask moved one token later (it starts one token into each answer and ends one past it);
- `post-norm`: the last slot replaced by its final-norm output, so speculators, which normalises it itself, trains
  on a twice-normalised state (what an export that took the post-norm state would do).
- `capped-ending`: the regenerated answers as text, re-rendered through the chat template and captured again (vLLM,
  float32, same points): every answer the target stopped at --max-tokens now ends with the end-of-turn token the
  template appends, an ending the target never produced there (what a pipeline that keeps text, not token ids, does).
- `original`: two drafts on the bundled conversations alone (those whose first user turn is not held out), trained
  alike: `original-answers` on the answers the dataset ships (written by others: what a trainer fed a public chat set
  learns), `target-answers` on the target's own answers to the same conversations (regenerated, every assistant turn
  in order, --original-max-tokens): how much does training on the target's own words buy at equal data?
- `transfer` (--transfer hf,vllm,sglang): the same regenerated answers captured again in bfloat16 by each engine
  named, the gate in warn mode against HF float32 (its divergence at every point printed beside the row), exported and trained
  as `wired` was, served by vLLM in float32 like every other row: does a draft trained on one engine's numbers lose
  anything when another engine serves it? SGLang 0.5.23 cannot capture bN: its run takes final_norm instead,
  exported with --last final_norm (divided by the final-norm weight, which speculators' own norm maps back).
The doctor judges every row of the main call against the main export: a draft trained on a mask or a last state that
is off is wired right, so it cannot see those two; the acceptance figure can.

Served rows (--variants, comma-separated, or all): `wired` (the last epoch as trained), `epoch<i>` (earlier checkpoints),
`shift+1` and `shift-1` (aux ids moved by one layer; `shift+1@epoch<i>` an earlier checkpoint's), `bottom3` ([0, 1, 2]), `last3` ([N-3, N-2, N-1]), `aux-off`
(aux capture switched off: `transformer_layer_config.eagle_config.use_aux_hidden_state` false, fc bypassed),
`d2t-absolute` (d2t rewritten as absolute target ids: vLLM fails while serving it), `dropped-names` (the decoder
layer's tensors under a prefix vLLM does not load: refused); those two are reported by pipeline.accept beside the
others, not measured. The doctor's verdict comes from pipeline.accept's own run of it.
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import common  # noqa: F401 - puts the repository root on sys.path (bench.*, pipeline.*, tests.helpers.*)
from tests.helpers.drafts import copy_with, rewire
from tests.helpers.trainers import speculators_train

REPO = common.REPO
TEMPLATES = [
    "Explain {t} to a beginner in a few sentences.", "What are the main advantages and drawbacks of {t}?",
    "Write a short paragraph about {t}.", "Give three practical tips related to {t}.",
    "How would you describe {t} to a ten-year-old?", "List the key facts someone should know about {t}.",
    "What is a common misconception about {t}?", "Summarise the history of {t} briefly.",
    "Write a haiku about {t}.", "Compare {t} with something similar and say how they differ.",
    "What questions should I ask before getting started with {t}?", "Describe a typical day involving {t}.",
    "Why does {t} matter today?", "Write a friendly email inviting a colleague to learn about {t}.",
    "What would be a good first project to learn {t}?", "Give a step-by-step guide to getting started with {t}.",
]
TOPICS = [
    "photosynthesis", "the water cycle", "compound interest", "machine learning", "the French revolution",
    "volcanoes", "recycling plastic", "learning a new language", "public transport", "the immune system",
    "black holes", "gardening in small spaces", "time management", "electric cars", "the stock market",
    "sleep hygiene", "renewable energy", "ancient Rome", "cooking pasta", "version control with git",
    "climate change", "the human heart", "birdwatching", "remote work", "chess openings", "honey bees",
    "the printing press", "running a marathon", "cloud computing", "coral reefs", "budget travel",
    "the Pythagorean theorem", "meditation", "earthquakes", "baking bread", "the solar system",
    "writing a resume", "democracy", "vaccines", "origami",
]


def run(cmd: list[str], log: Path, what: str, ok=lambda code: code == 0) -> None:
    t0 = time.perf_counter()
    with log.open("w") as out:
        done = subprocess.run(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, text=True)
    took = time.perf_counter() - t0
    if not ok(done.returncode):
        raise SystemExit(f"{what} failed (exit {done.returncode}, {took:.0f} s); its log: {log}\n"
                         + "".join(log.read_text().splitlines(keepends=True)[-15:]))
    print(f"{what}: {took:.0f} s (log {log})", flush=True)


def prompts(work: Path, n: int, held_out: int) -> tuple[Path, Path]:
    bundled = REPO / "pipeline" / "data" / "bundled" / "conversations.jsonl"
    texts = []
    for line in bundled.read_text().splitlines():
        messages = json.loads(line).get("messages") or []
        first = next((m["content"] for m in messages if m.get("role") == "user"), None)
        if isinstance(first, str) and first.strip():
            texts.append(first)
    texts += [t.format(t=topic) for t in TEMPLATES for topic in TOPICS]
    texts = list(dict.fromkeys(texts))
    random.Random(0).shuffle(texts)
    if n + held_out > len(texts):
        raise SystemExit(f"--prompts {n} + --held-out {held_out} > the {len(texts)} prompts there are")
    train, test = work / "train_prompts.jsonl", work / "heldout_prompts.jsonl"
    for path, chunk in ((test, texts[:held_out]), (train, texts[held_out:held_out + n])):
        path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": c}]}) + "\n" for c in chunk))
    return train, test


def _copy(src: Path, dst: Path) -> Path:
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    return dst


def variants(wired: Path, epochs: list[Path], num_layers: int, where: Path, wanted: set[str]) -> dict[str, Path]:
    import torch

    ids = json.loads((wired / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"]
    out: dict[str, Path] = {"wired": wired}
    out |= {f"epoch{e.name}": e for e in epochs[:-1]}
    out["shift+1"] = lambda: rewire(wired, where / "shift+1", [i + 1 for i in ids])
    for e in epochs[:-1]:  # the budget sweep's other axis: does a shift show earlier in training?
        out[f"shift+1@epoch{e.name}"] = lambda e=e: rewire(e, where / f"shift+1@epoch{e.name}", [i + 1 for i in ids])
    out["shift-1"] = lambda: rewire(wired, where / "shift-1", [i - 1 for i in ids])
    out["bottom3"] = lambda: rewire(wired, where / "bottom3", [0, 1, 2])
    out["last3"] = lambda: rewire(wired, where / "last3", [num_layers - 3, num_layers - 2, num_layers - 1])
    # where vLLM reads the switch for a speculators draft (the layer config it builds the draft from): the draft is fed
    # the target's H-wide last state, its fc dropped at load
    out["aux-off"] = lambda: copy_with(wired, where / "aux-off", config=lambda c: c["transformer_layer_config"].update(
        eagle_config={"use_aux_hidden_state": False}))
    out["d2t-absolute"] = lambda: copy_with(wired, where / "d2t-absolute", tensors=lambda t: {
        **t, "d2t": t["d2t"] + torch.arange(t["d2t"].numel(), dtype=t["d2t"].dtype)})
    out["dropped-names"] = lambda: copy_with(wired, where / "dropped-names", tensors=lambda t: {
        (f"draft_model.{k}" if k.startswith("layers.") else k): v for k, v in t.items()})
    chosen = {}
    for name, make in out.items():
        if "all" in wanted or name in wanted or (name.startswith("epoch") and "epochs" in wanted):
            chosen[name] = make() if callable(make) else make
    return chosen


def _mask_shifted(export: Path, dst: Path) -> Path:
    """A copy of `export` whose loss mask is one token later: position i takes position i-1's flag."""
    import pyarrow as pa

    _copy(export, dst)
    arrow = next(dst.glob("*.arrow"))
    with pa.OSFile(str(arrow), "rb") as f:
        table = pa.ipc.open_stream(f).read_all()
    masks = [[0] + m[:-1] for m in table.column("loss_mask").to_pylist()]
    table = table.set_column(table.schema.get_field_index("loss_mask"), "loss_mask",
                             pa.array(masks, type=table.schema.field("loss_mask").type))
    with pa.OSFile(str(arrow), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return dst


def _post_norm_last(export: Path, dst: Path, model: Path) -> Path:
    """A copy of `export` whose last slot went through the target's final RMSNorm (weights and eps from `model`)."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    from pipeline.models.checkpoint import CheckpointTensors

    _copy(export, dst)
    checkpoint = CheckpointTensors(model)
    for path in sorted((dst / "hidden_states").glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
        hs = tensors["hidden_states"]
        normed = checkpoint.final_norm(hs[:, -1])
        tensors["hidden_states"] = torch.cat([hs[:, :-1], normed.to(hs.dtype)[:, None]], dim=1)
        save_file(tensors, str(path), metadata=meta)
    return dst


def _as_text(regen: Path, dst: Path) -> Path:
    """The regeneration's conversations as chat records with the answers as text (the token ids and the end reason
    dropped): what a pipeline that stores text hands its extractor."""
    import pyarrow.parquet as pq

    rows = []
    for part in sorted((regen / "records").glob("*.parquet")):
        for record in pq.read_table(part).to_pylist():
            turn = record["turns"][-1]
            rows.append({"messages": json.loads(turn["messages"]) + [{"role": "assistant", "content": turn["text"]}]})
    dst.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return dst


def _bundled_not_held_out(test: Path, dst: Path) -> Path:
    """The bundled conversations as they ship (their own answers), less those whose first user turn is a held-out
    prompt."""
    held_out = {json.loads(line)["messages"][0]["content"] for line in test.read_text().splitlines()}
    bundled = REPO / "pipeline" / "data" / "bundled" / "conversations.jsonl"
    kept = [line for line in bundled.read_text().splitlines()
            if next((m["content"] for m in json.loads(line)["messages"] if m.get("role") == "user"), None)
            not in held_out]
    dst.write_text("".join(line + "\n" for line in kept))
    return dst


def _extract_export(data: Path, root: Path, work: Path, what: str, draft_vocab: int,
                    engine: tuple[str, ...] = ("engine=vllm", "engine.dtype=float32", "gate.mode=off"),
                    last: str = "last") -> Path:
    """`data` (chat records or a regeneration) captured at [2,15,27,<last>] (by default as the main run was: vLLM,
    float32, the gate off as it already judged these engines there) and exported; each step skipped when its result is
    there. `last` final_norm (SGLang cannot capture bN): exported with --last final_norm."""
    run_dir, export = root / "run", root / "export"
    if not (run_dir / "manifest.json").is_file():
        root.mkdir(parents=True, exist_ok=True)
        run([sys.executable, "-m", "pipeline.extract", "model=smollm2", *engine, f"data.path={data}",
             f"out_dir={run_dir}", f"capture.points=[2,15,27,{last}]", f"hydra.run.dir={root / 'extract.hydra'}"],
            work / "logs" / f"extract-{what}.log", f"extract ({what})")
    return _export(run_dir, export, work, what, draft_vocab, *(("--last", last) if last != "last" else ()))


def _export(run_dir: Path, out: Path, work: Path, what: str, draft_vocab: int, *extra: str) -> Path:
    """`run_dir` exported to speculators' layout with its draft vocabulary, unless `out` already holds it."""
    if not (out / "export.json").is_file():
        run([sys.executable, "-m", "pipeline.export", str(run_dir), "--format", "speculators", "--out", str(out),
             "--draft-vocab", str(draft_vocab), *extra], work / "logs" / f"export-{what}.log", f"export ({what})")
    return out


def original_exports(test: Path, work: Path, draft_vocab: int, max_tokens: int) -> dict[str, Path]:
    """The `original` arm's two exports: the bundled conversations' own answers, and the target's answers to them."""
    root = work / "arms" / "original"
    root.mkdir(parents=True, exist_ok=True)
    data = _bundled_not_held_out(test, root / "bundled.jsonl")
    regen = root / "regen"
    if not (regen / "manifest.json").is_file():
        run([sys.executable, "-m", "pipeline.regenerate", "model=smollm2", "engine=vllm", "engine.dtype=float32",
             f"data.path={data}", f"out_dir={regen}", f"sampling.max_tokens={max_tokens}",
             f"hydra.run.dir={root / 'regen.hydra'}"], work / "logs" / "regenerate-original.log",
            "regenerate (original arm)")
    return {"original-answers": _extract_export(data, root / "answers", work, "original-answers", draft_vocab),
            "target-answers": _extract_export(regen, root / "target", work, "target-answers", draft_vocab)}


def arm_exports(run_dir: Path, export: Path, model: Path, work: Path, wanted: set[str], draft_vocab: int,
                regen: Path) -> dict[str, Path]:
    """Each trained arm's export, made once (a rerun finds it)."""
    arms: dict[str, Path] = {}
    for name in ("embed", "mask-shift", "post-norm", "capped-ending"):
        if "all" not in wanted and name not in wanted:
            continue
        dst = work / "arms" / name / "export"
        if not (dst / "export.json").is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            if name == "embed":
                _export(run_dir, dst, work, name, draft_vocab, "--aux", "embed,2,15")
            elif name == "mask-shift":
                _mask_shifted(export, dst)
            elif name == "capped-ending":
                _extract_export(_as_text(regen, dst.parent / "as_text.jsonl"), dst.parent, work, name, draft_vocab)
            else:
                _post_norm_last(export, dst, model)
        arms[name] = dst
    return arms


def transfer_exports(regen: Path, work: Path, engines: list[str], draft_vocab: int) -> dict[str, tuple[Path, dict]]:
    """Per engine: (its bf16 capture's export, the gate's summary against HF float32 from the run's manifest)."""
    out = {}
    for engine in engines:
        root = work / "transfer" / f"{engine}-bf16"
        export = _extract_export(regen, root, work, f"{engine}-bf16", draft_vocab,
                                 (f"engine={engine}", "engine.dtype=bfloat16", "diff.reference=hf@float32",
                                  "gate.mode=warn"), last="final_norm" if engine == "sglang" else "last")
        manifest = json.loads((root / "run" / "manifest.json").read_text())
        out[f"{engine}-bf16"] = (export, _gate_summary(manifest))
    return out


def _gate_summary(manifest: dict) -> dict:
    """The gate's figures for each pair, as the run's manifest records them (provenance.diff)."""
    diff = manifest["provenance"].get("diff") or {}
    return {"status": diff.get("status"), **{pair: {k: v[k] for k in ("worst_rel_l2", "kl", "top1", "status") if k in v}
                                             for pair, v in (diff.get("pairs") or {}).items()}}


def accept(drafts: dict[str, Path], export: Path, test: Path, out: Path, args, log: Path) -> dict:
    """One call for every draft: one vLLM refuses or fails on is reported beside the others (exit 2 or 1)."""
    cmd = [sys.executable, "-m", "pipeline.accept", "--serve", "vllm", "--export", str(export), "--prompts", str(test),
           "--out", str(out), "--num-speculative-tokens", str(args.k), "--max-tokens", str(args.accept_tokens),
           "--dtype", "float32"]
    for path in drafts.values():
        cmd += ["--draft", str(path)]
    # some drafts measured, others refused (2) or failed on (1): the report has both
    run(cmd, log, f"accept ({len(drafts)} drafts)",
        ok=lambda code: code == 0 or (code in (1, 2) and (out / "report.json").is_file()))
    return json.loads((out / "report.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=REPO / "bench" / "out" / "closed_loop")
    ap.add_argument("--prompts", type=int, default=300, help="prompts regenerated and trained on")
    ap.add_argument("--held-out", type=int, default=24, help="prompts acceptance is measured on (never trained on)")
    ap.add_argument("--max-tokens", type=int, default=96, help="the target's answer length when regenerating")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--optimizer", choices=("muon", "adamw"), default="muon",
                    help="speculators' default is Muon, whose bf16 Newton-Schulz is emulated on CPUs without AMX; "
                         "AdamW with a short --total-seq-len buys many more steps for the time")
    ap.add_argument("--total-seq-len", type=int, default=2048, help="tokens per training step (speculators packs)")
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--k", type=int, default=3, help="speculative tokens when serving")
    ap.add_argument("--accept-tokens", type=int, default=48, help="tokens generated per held-out prompt")
    ap.add_argument("--variants", default="all")
    ap.add_argument("--arms", default="",
                    help="trained variants: embed, mask-shift, post-norm, capped-ending, original (or all)")
    ap.add_argument("--original-max-tokens", type=int, default=256,
                    help="the target's answer length when regenerating the bundled conversations (original arm)")
    ap.add_argument("--transfer", default="", help="engines whose bf16 captures train a draft each: hf, vllm, sglang")
    args = ap.parse_args()

    from pipeline.factory.tiny import ensure_model

    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    model = ensure_model("smollm2-135m-instruct")
    num_layers = json.loads((model / "config.json").read_text())["num_hidden_layers"]
    train, test = prompts(work, args.prompts, args.held_out)
    py = sys.executable
    t_all = time.perf_counter()

    regen = work / "regen"
    if not (regen / "manifest.json").is_file():
        run([py, "-m", "pipeline.regenerate", "model=smollm2", "engine=vllm", "engine.dtype=float32",
             f"data.path={train}", f"out_dir={regen}", f"sampling.max_tokens={args.max_tokens}",
             f"hydra.run.dir={logs / 'regen.hydra'}"], logs / "regenerate.log", "regenerate")
    run_dir = work / "run"
    if not (run_dir / "manifest.json").is_file():
        run([py, "-m", "pipeline.extract", "model=smollm2", "engine=vllm", "engine.dtype=float32",
             "diff.reference=hf@float32", f"data.path={regen}", f"out_dir={run_dir}",
             "capture.points=[embed,2,15,27,last]", f"hydra.run.dir={logs / 'extract.hydra'}"],
            logs / "extract.log", "extract")
    export = _export(run_dir, work / "export", work, "wired", args.draft_vocab, "--aux", "2,15,27")

    def trained(data: Path, ckpt: Path, what: str) -> Path:
        last = ckpt / str(args.epochs - 1)
        if not (last / "config.json").is_file():
            run(speculators_train(model, data, ckpt, epochs=args.epochs, total_seq_len=args.total_seq_len,
                                  lr=args.lr, ttt_steps=args.k, num_workers=1, log_dir=ckpt.parent / "train-logs",
                                  extra=("--optimizer", args.optimizer, "--seed", "0")),
                logs / f"train-{what}.log", f"train {what} ({args.epochs} epochs)")
        return last

    # the arms' exports before any training: one that cannot be made is known in seconds
    wanted = set(filter(None, args.arms.split(",")))
    arms = arm_exports(run_dir, export, model, work, wanted, args.draft_vocab, regen)
    if "all" in wanted or "original" in wanted:
        arms |= original_exports(test, work, args.draft_vocab, args.original_max_tokens)
    transfer = transfer_exports(regen, work, list(filter(None, args.transfer.split(","))), args.draft_vocab)
    ckpt = work / "ckpt"
    last = trained(export, ckpt, "wired")
    trained_arms: dict[str, Path] = {}
    for name, (data, gate) in transfer.items():
        trained_arms[name] = trained(data, data.parent / "ckpt", name)
        print(f"{name} capture, gate against HF float32: {json.dumps(gate)[:600]}", flush=True)
    trained_arms |= {name: trained(data, data.parent / "ckpt", name) for name, data in arms.items()}
    epochs = sorted((p for p in ckpt.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    drafts = variants(last, epochs, num_layers, work / "variants", set(args.variants.split(",")))
    drafts |= {name: path for name, path in trained_arms.items() if name != "embed"}
    stamp = time.strftime("%Y%m%d-%H%M%S")  # every measurement kept: a rerun serving other variants adds its own
    reports = [accept(drafts, export, test, work / f"accept-{stamp}", args, logs / f"accept-{stamp}.log")]
    names = {str(p): name for name, p in drafts.items()}
    if "embed" in trained_arms:
        # its own call: the doctor reads the features this draft was trained on
        embed = {"embed-as-trained": trained_arms["embed"],
                 "embed-served-2,15,27": rewire(trained_arms["embed"], work / "variants" / "embed-served", [2, 15, 27])}
        reports.append(accept(embed, arms["embed"], test, work / f"accept-embed-{stamp}", args,
                              logs / f"accept-embed-{stamp}.log"))
        names |= {str(p): name for name, p in embed.items()}
    table(reports, names, args, work / f"accept-{stamp}", time.perf_counter() - t_all)


def table(reports: list[dict], by_path: dict[str, str], args, report_dir: Path, took: float) -> None:
    report = reports[0]
    print(f"\nclosed loop: SmolLM2-135M-Instruct, {args.prompts} regenerated prompts, {args.epochs} epochs, "
          f"K={args.k}, {report['num_prompts']} held-out prompts x {args.accept_tokens} tokens, float32; "
          f"{took:.0f} s in all; tokens/s plain {report['plain']['tokens_per_s']:.1f}")
    head = f"| draft | doctor | acceptance length | {' | '.join(f'pos {i + 1}' for i in range(args.k))} | " \
           "differs from greedy | tokens/s |"
    print(head)
    print("|" + "---|" * (6 + args.k - 1))
    rows = [(d, prov) for r in reports for d, prov in zip(r["drafts"], r["provenance"]["drafts"])]
    for d, prov in rows:
        o = d["overall"]
        pp = " | ".join(f"{v:.3f}" for v in (o["per_position"] or [0.0] * args.k))
        al = "-" if o["acceptance_length"] is None else f"{o['acceptance_length']:.3f}"
        print(f"| {by_path.get(prov['path'], d['name'])} | {d['doctor']['verdict']} | {al} | {pp} | "
              f"{d['differing']} of {len(d['prompts'])} | {d['tokens_per_s']:.1f} |")
    for f in (f for r in reports for f in r["failed"]):
        print(f"| {by_path.get(f['path'], f['name'])} | {f['doctor']['verdict']} | not measured, exit "
              f"{f['exit_code']}: {f['error'][:300]} |")
    print(f"\nreport: {report_dir / 'report.html'}")


if __name__ == "__main__":
    main()
