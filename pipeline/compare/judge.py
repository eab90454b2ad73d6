"""Judging one comparison: thresholds per dtype, the first divergent point, its likely locus, and routing flips.

Points are walked in canonical order (b0 .. bN, final_norm). The first point over the dtype's thresholds (rel_l2 grows
with the number of decoder layers before the point, `rel_l2_per_layer`) is the onset.
Its locus comes from where it sits and what the data shows there:
- b0: the embedding;
- final_norm while bN agrees: the final norm;
- after an MoE layer, with the median token still near noise and only a minority of tokens far off: MoE routing
  flips (bf16 rounding changes a near-tied expert choice; the change then spreads through attention);
- position 0 within tolerance and later positions not: attention / positions (rope, masks, KV);
- otherwise token-local computation (MLP or MoE experts, norms) of the layers between the last agreeing point and
  the onset.
Divergence consistent with routing flips is a warning (it is what bf16 does to an MoE model); anything else over the
thresholds fails.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from pipeline.compare.kinds import PointVerdict, Status
from pipeline.compare.metrics import PointStats
from pipeline.config import RoutingFlipConfig, Thresholds
from pipeline.points import FINAL_NORM

PRECISION = {"float32": 3, "float16": 2, "bfloat16": 1}


def pair_dtype(a: str, b: str) -> str:
    """The less precise of two compute dtypes (what the pair is judged by)."""
    known = [d for d in (a, b) if d in PRECISION]
    return min(known, key=PRECISION.__getitem__) if known else "bfloat16"


@dataclass(kw_only=True)
class LogitStats:
    num_tokens: int
    top1: float  # fraction of tokens whose argmax agrees
    kl_mean: float  # KL(a || b) in nats, mean over tokens
    kl_p99: float
    kl_max: float
    source_a: str  # "final_norm" or "bN + checkpoint norm"
    source_b: str


@dataclass(kw_only=True)
class Verdict:
    status: Status = Status.PASS
    dtype: str = "float32"
    onset: str | None = None  # the first point over the thresholds
    last_within: str | None = None  # the last point within them before the onset
    locus: str | None = None
    routing_flips: bool = False
    point_status: dict[str, PointVerdict] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)  # what is over the thresholds at the onset
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    headline: str = ""


def _boundary(label: str, num_layers: int) -> int:
    return num_layers if label == FINAL_NORM else int(label[1:])


def at_depth(t: Thresholds, label: str, num_layers: int) -> Thresholds:
    """The limits at one point: rel_l2 plus the per-layer term for each decoder layer before it."""
    if not t.rel_l2_per_layer:
        return t
    return replace(t, rel_l2=t.rel_l2 + t.rel_l2_per_layer * _boundary(label, num_layers), rel_l2_per_layer=0.0)


def over_reasons(s: PointStats, t: Thresholds) -> list[str]:
    reasons = []
    if s.judged_rel_l2 > t.rel_l2:
        reasons.append(f"rel L2 {s.rel_l2:.2e} (p90 per token {s.p90:.2e}) > {t.rel_l2:g}")
    if s.cosine < t.cosine:
        reasons.append(f"cosine {s.cosine:.6f} < {t.cosine:g}")
    if t.max_abs is not None and s.max_abs > t.max_abs:
        reasons.append(f"max abs {s.max_abs:.3g} > {t.max_abs:g}")
    return reasons


def _span(labels: Sequence[str], onset_index: int, num_layers: int) -> list[int]:
    """1-based numbers of the decoder layers between the previous compared point and the onset."""
    end = _boundary(labels[onset_index], num_layers)
    start = _boundary(labels[onset_index - 1], num_layers) if onset_index > 0 else 0
    return list(range(start + 1, end + 1))


def _layers_text(layers: Sequence[int]) -> str:
    if not layers:
        return "no decoder layer"
    return f"layer {layers[0]}" if len(layers) == 1 else f"layers {layers[0]}-{layers[-1]}"


def _flip_like(s: PointStats, t: Thresholds, flips: RoutingFlipConfig, moe_before: bool) -> bool:
    """A flip is a discrete jump: some token far off (> token_level), but only a minority, and the median token
    still near noise. A uniform drift of every token, however small, is not a flip."""
    return (flips.enabled and moe_before and s.flip_fraction > 0 and s.flip_fraction <= flips.max_fraction
            and s.p50 <= flips.bulk_factor * t.rel_l2)


def _locus(labels: Sequence[str], i: int, stats: Mapping[str, PointStats], t: Thresholds, flips: bool,
           flip_cfg: RoutingFlipConfig, moe: set[int], num_layers: int) -> str:
    label, s = labels[i], stats[labels[i]]
    layers = _span(labels, i, num_layers)
    if label == "b0":
        return "embedding: b0 (the embedding lookup) differs"
    if label == FINAL_NORM and not layers:
        return f"final norm: b{num_layers} agrees, final_norm does not"
    if flips:
        return (f"MoE routing: expert-selection flips by {labels[i]} ({s.flip_fraction:.1%} of tokens off by more "
                f"than {flip_cfg.token_level:g}, median token {s.p50:.2e})")
    kind = "MoE" if set(layers) & moe else "dense MLP"
    where = _layers_text(layers) + (" + final norm" if label == FINAL_NORM else "")
    if s.pos0 <= t.rel_l2 and s.later > max(t.rel_l2, 3 * s.pos0):
        return (f"attention / positions in {where}: position 0 agrees ({s.pos0:.2e}), later positions do not "
                f"({s.later:.2e})")
    return (f"token-local computation in {where} ({kind}, norms): position 0 diverges like later positions "
            f"({s.pos0:.2e} vs {s.later:.2e})")


def judge_points(stats: Mapping[str, PointStats], labels: Sequence[str], *, name: str, dtype: str, t: Thresholds,
                 flip_cfg: RoutingFlipConfig, moe: set[int], num_layers: int) -> Verdict:
    """Walk the points in canonical order; the first one over the thresholds decides."""
    v = Verdict(dtype=dtype)
    limits = {label: at_depth(t, label, num_layers) for label in labels}
    onset = next((i for i, label in enumerate(labels) if over_reasons(stats[label], limits[label])), None)
    for i, label in enumerate(labels):
        v.point_status[label] = PointVerdict.OK if onset is None or i < onset else PointVerdict.DOWNSTREAM
    if onset is None:
        v.last_within = labels[-1] if labels else None
        v.headline = f"{name}: every point within {dtype} tolerance"
        return v
    label, s = labels[onset], stats[labels[onset]]
    v.onset, v.last_within = label, labels[onset - 1] if onset > 0 else None
    moe_before = any(k <= _boundary(label, num_layers) for k in moe) and bool(_span(labels, onset, num_layers))
    t = limits[label]
    v.routing_flips = _flip_like(s, t, flip_cfg, moe_before)
    v.locus = _locus(labels, onset, stats, t, v.routing_flips, flip_cfg, moe, num_layers)
    v.point_status[label] = PointVerdict.FLIPS if v.routing_flips else PointVerdict.OVER
    for later in labels[onset + 1:]:
        v.point_status[later] = PointVerdict.FLIPS if v.routing_flips else PointVerdict.DOWNSTREAM
    v.reasons = over_reasons(s, t)
    worst = max(stats[x].rel_l2 for x in labels[onset:])
    if v.routing_flips:
        v.status = Status.WARN
        v.warnings.append(f"{name}: {_agree(v)}; from {label} on the divergence is consistent with MoE routing "
                          f"flips: at {label} {s.flip_fraction:.1%} of tokens are off by more than "
                          f"{flip_cfg.token_level:g} while the median token is at {s.p50:.2e}; rel L2 up to "
                          f"{worst:.2e} downstream")
    else:
        v.status = Status.FAIL
        v.failures.append(failure_text(name, v))
    v.headline = (v.warnings or v.failures)[0]
    return v


def _agree(v: Verdict) -> str:
    return f"agree within {v.dtype} tolerance through {v.last_within}" if v.last_within else "diverge at once"


def failure_text(name: str, v: Verdict) -> str:
    return f"{name}: {_agree(v)}, then diverge from {v.onset} ({'; '.join(v.reasons)}); likely locus: {v.locus}"


def relocate(v: Verdict, name: str, locus: str) -> None:
    """Replace the onset's locus (e.g. with the alignment matrix's explanation) in the verdict and its failure."""
    old = failure_text(name, v)
    v.locus = locus
    v.failures = [failure_text(name, v) if f == old else f for f in v.failures]
    v.headline = v.failures[0] if v.failures else v.headline


def judge_logits(v: Verdict, logits: LogitStats | None, t: Thresholds, name: str) -> None:
    if logits is None:
        return
    over = []
    if logits.top1 < t.top1:
        over.append(f"top-1 agreement {logits.top1:.1%} < {t.top1:.1%}")
    if logits.kl_mean > t.kl:
        over.append(f"mean KL {logits.kl_mean:.2e} > {t.kl:g}")
    if not over:
        return
    text = f"{name}: logits: {'; '.join(over)}"
    if v.routing_flips:
        v.warnings.append(text + " (downstream of the routing flips)")
    elif v.status == Status.FAIL:
        v.failures.append(text + f" (downstream of the divergence at {v.onset})")
    else:
        v.status = Status.FAIL
        v.failures.append(text + " although every compared hidden point is within tolerance")
        v.headline = v.failures[0]
