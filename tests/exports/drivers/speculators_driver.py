"""Runs in .venv-speculators (never in the pipeline's environment): load an export through speculators' own classes.

    python speculators_driver.py load EXPORT_DIR RESULT_DIR
        every row through speculators.train.data.ArrowDataset (and its FileTransfer); writes RESULT_DIR/loaded.safetensors
        (per row i: s{i}.hidden_states [T, K*H], s{i}.verifier_last_hidden_states [T, H], s{i}.input_ids, s{i}.loss_mask)
        and RESULT_DIR/result.json (row count, shapes, dtypes)
    python speculators_driver.py train EXPORT_DIR RESULT_DIR VERIFIER_DIR NUM_SAMPLES
        one optimisation step of speculators' own Eagle3DraftModel on the first rows, on CPU; writes result.json
        (loss before and after, number of parameters changed) and the trained draft with its own save_pretrained to
        RESULT_DIR/draft
    python speculators_driver.py vocab EXPORT_DIR RESULT_DIR VERIFIER_DIR N
        the export's draft vocabulary files through speculators' own code: its train CLI's loader (given
        --d2t-path/--t2d-path, and finding them in its data path), its build_vocab_mappings_from_distribution over the
        export's token_freq.pt, its save_token_frequency_distribution over the export's own dataset; writes
        result.json (what agreed, whether the export's listing changed) and loaded.safetensors (d2t, t2d, and the
        frequencies as ids/counts)
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from speculators.train.data import ArrowDataset, CollateFn


def load(export_dir: Path, result_dir: Path) -> None:
    dataset = ArrowDataset(max_len=1 << 20, datapath=export_dir, on_missing="raise")
    tensors, rows = {}, []
    for i in range(len(dataset)):
        item = dataset[i]
        if not isinstance(item, dict):
            raise SystemExit(f"row {i}: speculators returned {item!r} instead of a sample")
        for key in ("hidden_states", "verifier_last_hidden_states", "input_ids", "loss_mask"):
            tensors[f"s{i}.{key}"] = item[key].contiguous()
        rows.append({key: [list(v.shape), str(v.dtype)] for key, v in item.items() if hasattr(v, "shape")})
    save_file(tensors, str(result_dir / "loaded.safetensors"))
    (result_dir / "result.json").write_text(json.dumps({"num_rows": len(dataset), "rows": rows,
                                                        "approx_lengths": dataset.approx_lengths}))


def train(export_dir: Path, result_dir: Path, verifier: Path, num_samples: int) -> None:
    from speculators.models.eagle3 import Eagle3DraftModel
    from speculators.models.eagle3.data import shift_batch
    from transformers import AutoConfig

    torch.manual_seed(0)
    sidecar = json.loads((export_dir / "export.json").read_text())
    aux_ids = sidecar["serving"]["vllm"]["aux_layer_ids"]
    config = AutoConfig.from_pretrained(verifier)
    # the draft's decoder stack is built from this config's layer count: one layer, as speculators' train CLI builds
    # it (create_transformer_layer_config(num_layers=...)) and as the servers' EAGLE-3 draft classes expect
    config.num_hidden_layers = 1
    model = Eagle3DraftModel.from_training_args(
        config, verifier_name_or_path=str(verifier), draft_vocab_size=config.vocab_size, norm_before_residual=True,
        ttt_steps=2, target_layer_ids=aux_ids, draft_attn_impl="sdpa").to(torch.float32)
    dataset = ArrowDataset(max_len=1 << 20, datapath=export_dir, on_missing="raise")
    items = [dataset[i] for i in range(num_samples)]
    max_len = sum(int(x["input_ids"].shape[0]) for x in items)
    collate = CollateFn(max_len, config.hidden_size, num_target_layers=len(aux_ids), dtype=torch.float32,
                        preprocess=shift_batch)
    batch = collate(items)
    train_kwargs, _ = Eagle3DraftModel.get_trainer_kwargs(
        loss_fn="kl_div", loss_implementation="eager", ttt_steps=2, ttt_step_loss_decay=1.0)  # eager: no triton on CPU
    inputs = {k: batch[k] for k in ("hidden_states", "input_ids", "document_ids", "loss_mask", "position_ids",
                                    "verifier_last_hidden_states")}
    params = [p for p in model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    _, loss, _ = model(**inputs, **train_kwargs)
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        _, loss_after, _ = model(**inputs, **train_kwargs)
    changed = sum(not torch.equal(b, p.detach()) for b, p in zip(before, params))
    model.save_pretrained(str(result_dir / "draft"))
    (result_dir / "result.json").write_text(json.dumps({
        "loss": float(loss.detach()), "loss_after": float(loss_after), "params_changed": changed, "params": len(params),
        "batch_tokens": int(batch["input_ids"].shape[1]), "num_samples": num_samples}))


def _listing(root: Path) -> list[list]:
    return sorted([str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns] for p in root.rglob("*"))


def vocab(export_dir: Path, result_dir: Path, verifier: Path, n: int) -> None:
    import argparse

    from datasets import load_from_disk
    from speculators.train.cli import _load_mappings, parse_vocab_mappings
    from speculators.train.vocab_mapping import (build_vocab_mappings_from_distribution, get_target_vocab_size,
                                                 save_token_frequency_distribution)

    before = _listing(export_dir)
    d2t, t2d, size = _load_mappings(export_dir / f"d2t-{n}.npy", export_dir / f"t2d-{n}.npy", n)  # --d2t/t2d-path
    args = argparse.Namespace(d2t_path=None, t2d_path=None, data_path=str(export_dir), draft_vocab_size=n,
                              token_freq_path=None, verifier_name_or_path=str(verifier), trust_remote_code=False)
    found_d2t, found_t2d, found_size = parse_vocab_mappings(args)  # the CLI without the flags: found in its data path
    freq = torch.load(export_dir / "token_freq.pt", weights_only=True)  # as the CLI loads it
    rebuilt_d2t, rebuilt_t2d = build_vocab_mappings_from_distribution(
        token_freq_dict=freq, draft_vocab_size=n, target_vocab_size=get_target_vocab_size(None, str(verifier)))
    own_path = result_dir / "own_token_freq.pt"  # speculators' own count over the export's dataset
    save_token_frequency_distribution(load_from_disk(str(export_dir)).with_format("torch"), own_path)
    own = torch.load(own_path, weights_only=True)
    after = _listing(export_dir)
    save_file({"d2t": d2t, "t2d": t2d, "freq_ids": torch.tensor(list(freq), dtype=torch.int64),
               "freq_counts": torch.tensor(list(freq.values()), dtype=torch.int64)},
              str(result_dir / "loaded.safetensors"))
    (result_dir / "result.json").write_text(json.dumps({
        "size": size, "found_size": found_size, "d2t_dtype": str(d2t.dtype), "t2d_dtype": str(t2d.dtype),
        "found_equal": torch.equal(found_d2t, d2t) and torch.equal(found_t2d, t2d),
        "rebuilt_equal": torch.equal(rebuilt_d2t, d2t) and torch.equal(rebuilt_t2d, t2d),
        "freq_types": sorted({f"{type(k).__name__}:{type(v).__name__}" for k, v in freq.items()}),
        "own_freq_equal": own == freq, "own_freq_same_order": list(own.items()) == list(freq.items()),
        "listing_unchanged": before == after}))


if __name__ == "__main__":
    mode, export, result = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    result.mkdir(parents=True, exist_ok=True)
    if mode == "load":
        load(export, result)
    elif mode == "train":
        train(export, result, Path(sys.argv[4]), int(sys.argv[5]))
    elif mode == "vocab":
        vocab(export, result, Path(sys.argv[4]), int(sys.argv[5]))
    else:
        raise SystemExit(f"unknown mode {mode!r}: load | train | vocab")
