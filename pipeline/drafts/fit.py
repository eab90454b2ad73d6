"""Checks on the draft's weights being finite, sizes and vocabularies (draft against target), d2t/t2d, the serving
flags, and the capture engine's kernels against the serving ones."""
from __future__ import annotations

import math
from pathlib import Path

import torch

from pipeline.drafts.checkpoint import Draft
from pipeline.drafts.flags import Flags, backend_flag, draft_path_flag
from pipeline.drafts.report import Finding
from pipeline.drafts.serving import ServerView
from pipeline.drafts.target import Target


def check_finite(draft: Draft) -> Finding:
    """NaN or inf in any floating-point tensor (counted by checkpoint.read_draft, every element): a server runs the
    draft as it is, so every token it proposes from them is garbage and acceptance falls to zero without an error."""
    bad = draft.non_finite
    if not bad:
        return Finding("OK", "finite", f"every floating-point value of the draft's {len(draft.tensors)} tensors is "
                       "finite")
    named = [f"{name} ({_count(t)} of {math.prod(t.shape)})" for name, t in sorted(bad.items())]
    return Finding("ERROR", "finite", f"{len(bad)} of the draft's {len(draft.tensors)} tensors hold non-finite "
                   f"values: {', '.join(named[:6])}{' ...' if len(named) > 6 else ''}; a server would serve them as "
                   "they are (every proposed token garbage): re-save the draft from a checkpoint without NaN/inf")


def _count(t) -> str:
    return " and ".join(part for part in (f"{t.nan} NaN" if t.nan else "", f"{t.inf} inf" if t.inf else "") if part)


def check_hidden(draft: Draft, target: Target) -> Finding:
    if target.hidden_size is None:
        return Finding("WARN", "hidden-size", "the target's hidden size is unknown: pass --run, --export or --target")
    if draft.input_width != target.hidden_size:
        field = "target_hidden_size" if draft.target_hidden_size else "hidden_size (no target_hidden_size)"
        return Finding("MISMATCH", "hidden-size", f"the draft reads aux states {draft.input_width} wide ({field}) but "
                       f"the target's hidden size is {target.hidden_size}: set target_hidden_size to "
                       f"{target.hidden_size}")
    return Finding("OK", "hidden-size", f"draft input width {draft.input_width} = target hidden size "
                   f"{target.hidden_size}")


def check_vocab(draft: Draft, target: Target) -> list[Finding]:
    out = []
    head = draft.tensors.get("lm_head.weight")
    draft_vocab = draft.draft_vocab_size or draft.vocab_size
    if head is not None and draft_vocab is not None and head.shape[0] != draft_vocab:
        out.append(Finding("MISMATCH", "vocab", f"lm_head.weight has {head.shape[0]} rows but the config's draft "
                           f"vocabulary is {draft_vocab}: set draft_vocab_size to {head.shape[0]}"))
    if target.vocab_size is None:
        out.append(Finding("WARN", "vocab", "the target's vocabulary size is unknown (provenance does not record it "
                           "and the run's model directory is gone): pass --target MODEL_DIR"))
    elif draft.vocab_size is not None and draft.vocab_size != target.vocab_size:
        out.append(Finding("MISMATCH", "vocab", f"the draft's vocab_size is {draft.vocab_size} but the target's is "
                           f"{target.vocab_size}: d2t and the embedding index another vocabulary; set vocab_size to "
                           f"{target.vocab_size}"))
    embed = draft.tensors.get("embed_tokens.weight")
    if embed is not None and target.vocab_size is not None and embed.shape[0] != target.vocab_size:
        out.append(Finding("MISMATCH", "vocab", f"embed_tokens.weight has {embed.shape[0]} rows, the target's "
                           f"vocabulary {target.vocab_size}"))
    if not out:
        out.append(Finding("OK", "vocab", f"vocab {draft.vocab_size}, draft vocab {draft_vocab}, lm_head "
                           f"{head.shape if head else 'absent'}"))
    return out


def check_d2t(draft: Draft, target: Target) -> Finding:
    vocab = target.vocab_size or draft.vocab_size
    draft_vocab = draft.draft_vocab_size or draft.vocab_size
    d2t, t2d = draft.vocab_maps.get("d2t"), draft.vocab_maps.get("t2d")
    if d2t is None:
        if draft_vocab is not None and vocab is not None and draft_vocab < vocab:
            return Finding("MISMATCH", "d2t", f"draft vocabulary {draft_vocab} < target {vocab} but no d2t: both "
                           "servers read draft id i as target id i; save d2t (target id - draft id) with the draft")
        return Finding("OK", "d2t", "no d2t: the draft predicts target ids directly")
    if tuple(d2t.shape) != (draft_vocab,):
        return Finding("MISMATCH", "d2t", f"d2t has shape {list(d2t.shape)}, the draft vocabulary {draft_vocab}: it "
                       f"must be [{draft_vocab}]")
    mapped = torch.arange(d2t.shape[0], dtype=torch.int64) + d2t.to(torch.int64)
    if t2d is not None and vocab is not None and tuple(t2d.shape) != (vocab,):
        return Finding("MISMATCH", "d2t", f"t2d has shape {list(t2d.shape)}, the target vocabulary {vocab}")
    as_absolute = d2t.to(torch.int64)
    if t2d is not None:
        wanted = torch.nonzero(t2d.to(torch.bool)).flatten()
        if torch.equal(torch.sort(mapped).values, wanted):
            return Finding("OK", "d2t", f"d2t holds offsets (draft id + d2t = target id, as both servers add), "
                           f"consistent with t2d ({wanted.numel()} target ids)")
        if torch.equal(torch.sort(as_absolute).values, wanted):
            return _absolute(d2t)
        return Finding("MISMATCH", "d2t", "draft id + d2t does not give the target ids t2d marks (neither offsets nor "
                       "absolute ids): rebuild d2t and t2d from the same token list")
    if vocab is not None and (int(mapped.max()) >= vocab or int(mapped.min()) < 0):
        return _absolute(d2t) if 0 <= int(as_absolute.min()) and int(as_absolute.max()) < vocab else \
            Finding("MISMATCH", "d2t", f"draft id + d2t leaves the target vocabulary [0, {vocab})")
    if torch.unique(mapped).numel() != mapped.numel():
        return Finding("MISMATCH", "d2t", "two draft ids map to the same target id through draft id + d2t")
    return Finding("OK", "d2t", "d2t holds offsets (draft id + d2t stays inside the target vocabulary, no id twice); "
                   "no t2d to cross-check")


def _absolute(d2t: torch.Tensor) -> Finding:
    return Finding("MISMATCH", "d2t", "d2t holds absolute target ids but SGLang and vLLM add it to the draft id "
                   "(hot_token_id = d2t + arange; target = base + draft_id_to_target_id): save d2t - arange("
                   f"{d2t.shape[0]}) instead")


def check_flags(flags: Flags | None, view: ServerView, draft: Draft) -> list[Finding]:
    if flags is None:
        return [Finding("WARN", "flags", "no --server-args: the speculative flags were not checked")]
    out = [Finding("MISMATCH", "flags", p) for p in flags.problems]
    out += [Finding("MISMATCH", "flags", o) for o in flags.overrides]
    named = draft_path_flag(flags, view.framework)
    if named and Path(named).exists() and Path(named).resolve() != draft.path.resolve():
        out.append(Finding("WARN", "flags", f"the server args name draft {named}, not {draft.path}"))
    if not out:
        out.append(Finding("OK", "flags", f"no {view.framework} speculative flag overrides or contradicts another"))
    return out


def _diff_figures(diff: dict | None) -> str:
    if not diff or diff.get("status") in (None, "off"):
        return "the run has no diff report (its gate was off): run python -m pipeline.diff with the serving engine"
    pairs = diff.get("pairs") or {}
    parts = [f"{name}: {p.get('status')}, worst rel L2 {p.get('worst_rel_l2')}, top-1 {p.get('top1')}, "
             f"KL {p.get('kl')}" for name, p in pairs.items()]
    return f"diff report ({diff.get('status')}): " + ("; ".join(parts) or "no pairs")


def check_kernels(target: Target, view: ServerView, flags: Flags | None) -> Finding:
    engine = target.engine
    if not engine:
        return Finding("WARN", "kernels", "no run provenance: the capture engine's kernels are unknown")
    captured = (f"{engine.get('framework')} {engine.get('framework_version')}, attention "
                f"{engine.get('attention_backend')}, quantization kernel "
                f"{(engine.get('quantization') or {}).get('kernel')}, {engine.get('dtype')}")
    backend = backend_flag(flags, view.framework) if flags else None
    same_framework = engine.get("framework") == view.framework and engine.get("framework_version") == view.version
    same_backend = backend is None or backend == engine.get("attention_backend")
    if same_framework and same_backend:
        return Finding("OK", "kernels", f"captured with {captured}; served by the same framework and version")
    serving = f"{view.framework} {view.version}, attention {backend or 'its own choice'}"
    return Finding("WARN", "kernels", f"captured with {captured}; served by {serving}: features differ by the "
                   f"kernels' rounding; {_diff_figures(target.diff)}")


def check_answers(target: Target, view: ServerView) -> Finding | None:
    """Who wrote the answers the drafter learned (a regeneration) beside who captured its features and who serves:
    None when the run's data was a prompt file's own answers (nothing to compare)."""
    answers = target.answers
    if not answers:
        return None
    a, f = answers.get("engine") or {}, target.engine or {}
    by = f"{a.get('framework')} {a.get('framework_version')} ({a.get('dtype')})"
    features = f"{f.get('framework')} {f.get('framework_version')} ({f.get('dtype')})"
    line = f"answers by {by}, features by {features}, served by {view.framework} {view.version}"
    if (a.get("framework"), a.get("framework_version"), a.get("dtype")) != \
            (f.get("framework"), f.get("framework_version"), f.get("dtype")):
        return Finding("WARN", "answers", f"{line}: the answers were sampled by another engine or dtype than the "
                       f"features were captured with; their kernels' rounding can pick other tokens at near ties")
    return Finding("OK", "answers", f"{line}: one engine wrote the answers and captured the features")
