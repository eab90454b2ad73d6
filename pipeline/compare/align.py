"""The alignment matrix: which reference point each point an engine claims to have captured really is.

The reference captures every boundary 0..N and final_norm. For each point the engine claims, the distance to every
reference point is the median per-token relative L2 (robust to the minority of tokens that MoE routing flips move
far); the nearest reference point is its match. Shifted, swapped, duplicated and missing points are named in words
("its b4 is reference b5: shifted by +1 layer"). A translation table is only a claim; this checks it on the real
engine, whatever the thresholds.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pipeline.compare.kinds import Check, Match
from pipeline.compare.metrics import as_float, per_token_rel_l2
from pipeline.compare.probe import ProbeCapture
from pipeline.config import AlignmentConfig
from pipeline.points import FINAL_NORM


@dataclass(kw_only=True)
class PointMatch:
    claimed: str
    matched: str  # the nearest reference point
    distance: float  # to `matched`
    claimed_distance: float | None  # to the reference point of the same name
    runner_up: str | None  # the second nearest reference point
    runner_up_distance: float | None
    votes: float  # fraction of tokens whose nearest reference point is `matched`
    status: Match


@dataclass(kw_only=True)
class Alignment:
    engine: str
    reference: str
    rows: list[str]  # the engine's claimed points
    cols: list[str]  # the reference's points
    distances: list[list[float]]  # [row][col]
    matches: list[PointMatch] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    status: Check = Check.OK
    problem_of: dict[str, str] = field(default_factory=dict)  # claimed point -> the problem naming it

    def problem_for(self, claimed: str) -> str | None:
        return self.problem_of.get(claimed)


def _boundary(label: str) -> int | None:
    return None if label == FINAL_NORM else int(label[1:])


def _match(claimed: str, row: list[float], cols: list[str], votes: float, cfg: AlignmentConfig) -> PointMatch:
    order = sorted(range(len(cols)), key=lambda j: row[j])
    best, second = order[0], (order[1] if len(order) > 1 else None)
    own = row[cols.index(claimed)] if claimed in cols else None
    if row[best] > cfg.max_distance:
        status = Match.MISSING
    elif cols[best] != claimed:
        status = Match.MISALIGNED if own is None or own >= cfg.margin * max(row[best], 1e-30) else Match.AMBIGUOUS
    elif second is not None and row[second] < cfg.margin * row[best]:
        status = Match.AMBIGUOUS
    else:
        status = Match.OK
    return PointMatch(claimed=claimed, matched=cols[best], distance=row[best], claimed_distance=own,
                      runner_up=cols[second] if second is not None else None,
                      runner_up_distance=row[second] if second is not None else None, votes=votes, status=status)


def _order(label: str) -> int:
    b = _boundary(label)
    return 1 << 30 if b is None else b


def _describe_misaligned(m: PointMatch, by_claim: dict[str, PointMatch], engine: str) -> str:
    other = by_claim.get(m.matched)
    if other is not None and other.matched == m.claimed and other.status == Match.MISALIGNED:
        x, y = sorted((m.claimed, m.matched), key=_order)
        return f"{engine}'s {x} and {y} are swapped: its {x} is reference {y} and its {y} is reference {x}"
    own = f"{m.claimed_distance:.3g}" if m.claimed_distance is not None else "n/a"
    text = (f"{engine}'s {m.claimed} is reference {m.matched} (distance {m.distance:.3g}; to reference "
            f"{m.claimed} {own})")
    a, b = _boundary(m.claimed), _boundary(m.matched)
    if a is not None and b is not None:
        text += f": shifted by {b - a:+d} layer{'s' if abs(b - a) != 1 else ''}"
    elif b is None:
        text += ": the post-norm state is captured where the pre-norm state is claimed"
    else:
        text += ": a pre-norm state is captured where the post-norm final_norm is claimed"
    return text


def _describe_ambiguous(m: PointMatch, engine: str, cfg: AlignmentConfig) -> str:
    if m.matched == m.claimed:
        return (f"{engine}'s {m.claimed} cannot be told from reference {m.runner_up} at this noise level: distance "
                f"{m.distance:.3g} to {m.claimed}, {m.runner_up_distance:.3g} to {m.runner_up} "
                f"(diff.alignment.margin={cfg.margin})")
    own = f"{m.claimed_distance:.3g}" if m.claimed_distance is not None else "n/a"
    return (f"{engine}'s {m.claimed} is nearer reference {m.matched} ({m.distance:.3g}) than reference {m.claimed} "
            f"({own}), but not by diff.alignment.margin={cfg.margin}: undecided")


def _problems(matches: list[PointMatch], engine: str, cfg: AlignmentConfig) -> dict[str, str]:
    """claimed point -> a sentence naming what is wrong with it (a swap or a duplicate names both points)."""
    by_claim = {m.claimed: m for m in matches}
    problems: dict[str, str] = {}
    for m in matches:
        if m.status == Match.MISSING:
            problems[m.claimed] = (f"{engine}'s {m.claimed} matches no reference point (nearest: {m.matched} at "
                                   f"{m.distance:.3g} > diff.alignment.max_distance={cfg.max_distance})")
        elif m.status == Match.MISALIGNED:
            problems[m.claimed] = _describe_misaligned(m, by_claim, engine)
        elif m.status == Match.AMBIGUOUS:
            problems[m.claimed] = _describe_ambiguous(m, engine, cfg)
    matched: dict[str, list[str]] = {}
    for m in matches:
        if m.status in (Match.OK, Match.MISALIGNED, Match.AMBIGUOUS):
            matched.setdefault(m.matched, []).append(m.claimed)
    for ref, claims in matched.items():
        if len(claims) > 1:
            text = (f"{engine}'s {' and '.join(claims)} {'both' if len(claims) == 2 else 'all'} match reference "
                    f"{ref} (a point captured twice)")
            for c in claims:
                problems.setdefault(c, text)
    return problems


def _unverifiable(matches: list[PointMatch], rows: list[str], diverged_from: str | None) -> list[str]:
    """Downstream of a numerical divergence the states may be far from every reference point: a point that is not
    clearly elsewhere (ambiguous, or farthest-but-still-nearest to itself) cannot be verified, and is not a finding."""
    if diverged_from not in rows:
        return []
    start = rows.index(diverged_from)
    out = []
    for m in matches[start:]:
        if m.status == Match.AMBIGUOUS or (m.status == Match.MISSING and m.claimed_distance == m.distance):
            m.status = Match.UNVERIFIED
            out.append(m.claimed)
    return out


def _distance_matrix(engine: ProbeCapture, reference: ProbeCapture) -> tuple[list[list[float]], list[list[float]]]:
    """[row][col] median per-token relative L2, and per row the fraction of tokens nearest to each column. One
    reference point is in float32 at a time (Kimi: 63 points x 7168 per token)."""
    rows, cols = engine.labels, reference.labels
    xs = [as_float(engine.point(r)) for r in rows]
    distances = [[0.0] * len(cols) for _ in rows]
    nearest_rel = [torch.full((x.shape[0],), torch.inf) for x in xs]
    nearest_col = [torch.zeros(x.shape[0], dtype=torch.long) for x in xs]
    for j, col in enumerate(cols):
        ref = as_float(reference.point(col))
        for i, x in enumerate(xs):
            rel = per_token_rel_l2(ref, x)
            distances[i][j] = float(rel.median())
            closer = rel < nearest_rel[i]
            nearest_rel[i] = torch.where(closer, rel, nearest_rel[i])
            nearest_col[i] = torch.where(closer, j, nearest_col[i])
    votes = [[float((nearest_col[i] == j).float().mean()) for j in range(len(cols))] for i in range(len(rows))]
    return distances, votes


def align(engine: ProbeCapture, reference: ProbeCapture, cfg: AlignmentConfig,
          diverged_from: str | None = None) -> Alignment:
    """`diverged_from`: the first point where the engine's states fail the thresholds (from the comparison)."""
    cols, rows = reference.labels, engine.labels
    distances, votes = _distance_matrix(engine, reference)
    matches = []
    for i, claimed in enumerate(rows):
        best = min(range(len(cols)), key=lambda j: distances[i][j])
        matches.append(_match(claimed, distances[i], cols, votes[i][best], cfg))
    unverified = _unverifiable(matches, rows, diverged_from)
    result = Alignment(engine=engine.label, reference=reference.label, rows=rows, cols=cols, distances=distances,
                       matches=matches)
    result.problem_of = _problems(matches, engine.label, cfg)
    result.problems = list(dict.fromkeys(result.problem_of.values()))  # in point order, each sentence once
    if unverified:
        result.notes.append(f"{engine.label}'s {', '.join(unverified)} cannot be verified by the matrix: its states "
                            f"diverge numerically from {diverged_from} on (see the comparison)")
    hard = any(m.status in (Match.MISSING, Match.MISALIGNED) for m in matches) or any("captured twice" in p
                                                                            for p in result.problems)
    soft = any(m.status == Match.AMBIGUOUS for m in matches)
    result.status = Check.FAIL if hard or (soft and cfg.ambiguous == "fail") else (Check.WARN if soft else Check.OK)
    return result

