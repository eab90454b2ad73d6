"""Runs in .venv-specforge (never in the pipeline's environment, which reads no pickle): load an export through
SpecForge's own classes.

    python specforge_driver.py load EXPORT_DIR RESULT_DIR
        the file order of specforge.runtime.data_plane.offline_reader (OfflineManifestReader) and of
        specforge.data.preprocessing.list_local_files; every file through feature_store.load_feature_file (the raw
        keys) and OfflineEagle3Dataset (what training receives); writes RESULT_DIR/loaded.safetensors (per file i:
        s{i}.input_ids, s{i}.loss_mask, s{i}.hidden_state, s{i}.aux_hidden_state raw; s{i}.target, s{i}.train_hidden,
        s{i}.train_loss_mask as OfflineEagle3Dataset gives them) and RESULT_DIR/result.json
    python specforge_driver.py train EXPORT_DIR RESULT_DIR VERIFIER_DIR NUM_SAMPLES
        one optimisation step of SpecForge's own EAGLE-3 draft (LlamaForCausalLMEagle3 in OnlineEagle3Model, driven by
        Eagle3TrainStrategy with its TargetHead, target_repr="hidden_state" as offline training runs) on CPU; the
        trained draft is saved with its own save_pretrained to RESULT_DIR/draft, its eagle_config naming the export's
        aux slots in SGLang's numbering (the sidecar's serving ids, what a user serving it with SGLang writes)
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

# SpecForge's EAGLE-3 loss (specforge.core.loss.LogSoftmaxLoss) is a Triton kernel with no torch path; Triton's own
# interpreter runs that kernel on CPU tensors. Set before triton is first imported.
os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from specforge.data.preprocessing import OfflineEagle3Dataset, list_local_files  # noqa: E402
from specforge.runtime.data_plane.feature_store import load_feature_file  # noqa: E402
from specforge.runtime.data_plane.offline_reader import OfflineManifestReader  # noqa: E402

RAW_KEYS = ("input_ids", "loss_mask", "hidden_state", "aux_hidden_state")


def load(export_dir: Path, result_dir: Path) -> None:
    refs = OfflineManifestReader(str(export_dir)).read()
    paths = list_local_files(str(export_dir))
    dataset = OfflineEagle3Dataset(paths, max_len=1 << 20)
    tensors, files = {}, []
    for i, (ref, path) in enumerate(zip(refs, paths)):
        raw = load_feature_file(ref.feature_store_uri.removeprefix("file://"))
        if sorted(raw) != sorted(RAW_KEYS):
            raise SystemExit(f"{path}: keys {sorted(raw)} != {sorted(RAW_KEYS)}")
        for key in RAW_KEYS:
            tensors[f"s{i}.{key}"] = raw[key].clone()
        item = dataset[i]
        tensors[f"s{i}.target"] = item["target"].clone()
        tensors[f"s{i}.train_hidden"] = item["hidden_state"].clone()
        tensors[f"s{i}.train_loss_mask"] = item["loss_mask"].clone()
        files.append({"path": os.path.relpath(path, export_dir), "ref": ref.feature_store_uri,
                      "shapes": {k: [list(raw[k].shape), str(raw[k].dtype)] for k in RAW_KEYS}})
    save_file(tensors, str(result_dir / "loaded.safetensors"))
    (result_dir / "result.json").write_text(json.dumps({
        "num_files": len(paths), "num_refs": len(refs), "files": files,
        "same_order": [r.feature_store_uri.removeprefix("file://") for r in refs] == paths}))


def _head_dir(verifier: Path, result_dir: Path) -> Path:
    """TargetHead.from_pretrained reads an index.json; a one-file checkpoint gets one beside links to its files."""
    head = result_dir / "target_head"
    head.mkdir(exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        if not (head / name).exists():
            (head / name).symlink_to((verifier / name).resolve())
    (head / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"lm_head.weight": "model.safetensors"}}))
    return head


def train(export_dir: Path, result_dir: Path, verifier: Path, num_samples: int) -> None:
    from specforge.algorithms.eagle3.model import OnlineEagle3Model
    from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3
    from specforge.modeling.target.target_head import TargetHead
    from specforge.runtime.contracts import TrainBatch
    from specforge.training.strategies.base import Eagle3TrainStrategy
    from transformers import LlamaConfig

    torch.manual_seed(0)
    target = json.loads((verifier / "config.json").read_text())
    sglang_ids = json.loads((export_dir / "export.json").read_text())["serving"]["sglang"]["aux_layer_ids"]
    config = LlamaConfig(**{**target, "num_hidden_layers": 1, "draft_vocab_size": target["vocab_size"],
                            "architectures": ["LlamaForCausalLMEagle3"],
                            "eagle_config": {"eagle_aux_hidden_state_layer_ids": sglang_ids}})
    dataset = OfflineEagle3Dataset(list_local_files(str(export_dir)), max_len=1 << 20)
    dtype = dataset[0]["hidden_state"].dtype  # the draft computes in the export's dtype, as SpecForge trains
    draft = LlamaForCausalLMEagle3(config, attention_backend="sdpa").to(dtype)
    model = OnlineEagle3Model(draft, length=2, attention_backend="sdpa")
    strategy = Eagle3TrainStrategy(model, target_head=TargetHead.from_pretrained(str(_head_dir(verifier, result_dir))))
    params = [p for p in model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    optimizer = torch.optim.AdamW(params, lr=1e-3)

    def loss_over_samples() -> torch.Tensor:
        batches = [TrainBatch(sample_ids=[str(i)], strategy="eagle3", tensors=dataset[i],
                              metadata={"target_repr": "hidden_state"}) for i in range(num_samples)]
        return sum(strategy.forward_loss(b).loss for b in batches) / num_samples

    loss = loss_over_samples()
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        loss_after = loss_over_samples()
    changed = sum(not torch.equal(b, p.detach()) for b, p in zip(before, params))
    draft.save_pretrained(str(result_dir / "draft"))
    (result_dir / "result.json").write_text(json.dumps({
        "loss": float(loss.detach()), "loss_after": float(loss_after), "params_changed": changed,
        "params": len(params), "dtype": str(dtype), "num_samples": num_samples}))


if __name__ == "__main__":
    mode, export, result = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    result.mkdir(parents=True, exist_ok=True)
    if mode == "load":
        load(export, result)
    elif mode == "train":
        train(export, result, Path(sys.argv[4]), int(sys.argv[5]))
    else:
        raise SystemExit(f"unknown mode {mode!r}: load | train")
