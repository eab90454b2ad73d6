"""What the diff reads from the checkpoint itself: tensors found by name, the streamed logit comparison."""
from __future__ import annotations

import torch
from safetensors.torch import load_file

from pipeline.compare.anchors import Checkpoint


def test_tensors_are_found_by_name_and_rows_are_exact(tiny_model):
    path = tiny_model("tiny-kimi-int4")
    ck = Checkpoint(path)
    assert (ck.embedding_name, ck.head_name, ck.norm_name) == ("model.embed_tokens.weight", "lm_head.weight",
                                                              "model.norm.weight")
    table = load_file(str(path / "model.safetensors"))["model.embed_tokens.weight"]
    ids = [5, 7, 5, 4000, 0]
    assert torch.equal(ck.embedding_rows(ids), table[ids])
    assert ck.moe_layers == set(range(2, 9)) and ck.eps == 1e-6


def test_streamed_logit_comparison_equals_the_direct_one(tiny_model):
    ck = Checkpoint(tiny_model("tiny-llama"))
    g = torch.Generator().manual_seed(0)
    a = torch.randn(40, 256, generator=g)
    b = a + 0.3 * torch.randn(40, 256, generator=g)
    same, kl = ck.compare_logits(a, b, vocab_chunk=1000)  # 4096 tokens in 5 uneven chunks
    w = ck.head_weight.float()
    pa, pb = torch.log_softmax(a @ w.T, -1), torch.log_softmax(b @ w.T, -1)
    assert torch.equal(same, pa.argmax(-1) == pb.argmax(-1))
    assert torch.allclose(kl, (pa.exp() * (pa - pb)).sum(-1).clamp_min(0), atol=1e-5)
    same, kl = ck.compare_logits(a, a.clone())
    assert bool(same.all()) and float(kl.max()) < 1e-6
