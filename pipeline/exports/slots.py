"""Which of a run's captured points fill a trainer's slots: K aux states, then the one "last" state the format needs.

A trainer layout says how many aux states it takes and which state its last slot must hold (`TrainerLayout`). The
last state is never guessed: speculators applies the verifier's final norm to its last slot itself (so it needs bN,
the last layer's output before the norm), SpecForge's target head is the bare lm_head (so it needs final_norm). A run
that did not capture the needed one is refused with how to capture it; nothing is derived unasked (bN cannot be
recovered from final_norm, and final_norm recomputed from bN would only be a claim about the engine's own norm kernel).

One derivation is exact and offered when asked (`--last final_norm` in speculators' layout, for engines that cannot
capture bN: SGLang): speculators reads its last slot only as `lm_head(norm(x))`, and x = final_norm / w (w the
checkpoint's final-norm weight) has mean(x^2) = 1, so its RMSNorm gives back the engine's own final_norm (to eps/2
relatively). The export writes that x, checks it on every sample and records it in its sidecar (`last_state`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from pipeline.core.cli import ExitCode, Refused, UsageError
from pipeline.points import (FINAL_NORM, Point, PointError, canonical_order, family_of, parse_point, resolve,
                             to_native)

LAST_BOUNDARY = "bN"  # the layout's last slot is the last decoder layer's output, before the final norm


class ExportError(UsageError, ValueError):
    """A run that cannot be exported in the asked layout, or an export directory that is not this export's."""


class RunDoesNotVerify(Refused, ExportError):
    """The run's own check failed: its exit code is verify's for the same run, not a usage error's."""

    exit_code = ExitCode.REFUSED  # Refused's, stated: ExportError's USAGE is also among the bases


@dataclass(frozen=True, kw_only=True)
class TrainerLayout:
    """What a trainer's offline data loader reads: its name and version, how many aux states, which last state."""

    name: str
    trainer: str  # the package and version whose loader the layout was read from
    num_aux: int | None  # None: any K >= 1
    last: str  # LAST_BOUNDARY or FINAL_NORM
    why_last: str  # what the trainer does with the last slot, in words (goes into errors and the sidecar)
    unnorms_final_norm: bool = False  # reads its last slot only through the final norm: --last final_norm is exact


@dataclass(frozen=True, kw_only=True)
class SlotPlan:
    """The run's points behind each exported slot, and where they sit in the run's [T, P, H] hidden states."""

    aux: tuple[Point, ...]
    last: Point
    aux_index: tuple[int, ...]  # positions in the run's points
    last_index: int
    # the last slot holds `last` (final_norm) divided by the checkpoint's final-norm weight: what a layout that
    # normalises its last slot itself (speculators) reads back as final_norm
    last_unnormed: bool = False

    @property
    def points(self) -> tuple[Point, ...]:
        return (*self.aux, self.last)

    @property
    def indices(self) -> tuple[int, ...]:
        return (*self.aux_index, self.last_index)


def _engines_for(last: str) -> str:
    if last == FINAL_NORM:
        return "every engine captures it (hf, vllm, sglang): add final_norm to capture.points"
    return ("engine=hf or engine=vllm can capture it (SGLang 0.5.23 cannot capture bN): add last to capture.points, "
            "e.g. capture.points=[embed,1,4,7,last,final_norm]")


def _last_point(layout: TrainerLayout, num_layers: int) -> Point:
    return Point(None) if layout.last == FINAL_NORM else Point(num_layers)


def _parse(values: Sequence[str], num_layers: int, what: str) -> list[Point]:
    try:
        return [parse_point(v, num_layers=num_layers) for v in values]
    except PointError as exc:
        raise ExportError(f"{what}: {exc}") from None


def aux_labels(values: Sequence[int | str], *, convention: str, manifest: Mapping[str, Any]) -> list[str]:
    """`--aux` as capture.points takes it (canonical labels and boundaries, or a framework's native ids under
    `convention`), as the canonical labels `plan_slots` reads, translated by the run's model as capture.points is."""
    if convention == "canonical":
        return [str(v) for v in values]  # plan_slots parses them against the run's points
    model = (manifest.get("provenance") or {}).get("model") or {}
    written = f"--aux {','.join(str(v) for v in values)} (--convention {convention})"
    if not isinstance(num_layers := model.get("num_layers"), int):
        raise ExportError(f"{written}: the run's manifest has no model.num_layers to translate native ids by")
    try:
        points = resolve(values, convention=convention, family=family_of(str(model.get("model_type"))),
                         num_layers=num_layers)
    except PointError as exc:
        raise ExportError(f"{written}: {exc}") from None
    return [p.label for p in points]


def default_aux(run_points: Sequence[Point], num_layers: int) -> list[Point]:
    """The run's aux points: every boundary strictly between the embedding (b0) and the last layer's output (bN)."""
    return [p for p in run_points if not p.is_final_norm and 0 < p.boundary < num_layers]


def plan_slots(layout: TrainerLayout, *, run_points: Sequence[str], num_layers: int,
               aux: Sequence[str] | None = None, last: str | None = None) -> SlotPlan:
    """Choose the slots; ExportError names what is wrong and how to get a run that fits."""
    captured = _parse(run_points, num_layers, "run manifest points")
    need = _last_point(layout, num_layers)
    unnormed = False
    if last is not None:
        (asked,) = _parse([last], num_layers, "--last")
        # only where the state the layout reads is missing: a captured bN is copied as it is, never derived
        unnormed = asked != need and asked.is_final_norm and layout.unnorms_final_norm and need not in captured
        if asked != need and not unnormed:
            raise ExportError(f"--last {asked.label}: the {layout.name} layout's last slot must be {need.label} "
                              f"({layout.why_last}); another state there would be read as {need.label}, silently")
        if unnormed:
            need = asked
    if need not in captured:
        offer = (f"; or, from a run with final_norm, --last final_norm writes final_norm divided by the final-norm "
                 f"weight, which {layout.name}'s own norm maps back to final_norm exactly"
                 if layout.unnorms_final_norm and not unnormed else "")
        raise ExportError(f"run has no {need.label} (captured: {', '.join(p.label for p in captured)}); the "
                          f"{layout.name} layout needs it as its last slot ({layout.why_last}) and it is not derived "
                          f"from another point; {_engines_for(need.label if unnormed else layout.last)}{offer}")
    chosen = default_aux(captured, num_layers) if aux is None else _parse(aux, num_layers, "--aux")
    try:
        chosen = canonical_order(chosen)
    except PointError as exc:
        raise ExportError(f"--aux: {exc}") from None
    _check_aux(layout, chosen, captured, need, explicit=aux is not None)
    return SlotPlan(aux=tuple(chosen), last=need, aux_index=tuple(captured.index(p) for p in chosen),
                    last_index=captured.index(need), last_unnormed=unnormed)


def _check_aux(layout: TrainerLayout, chosen: list[Point], captured: list[Point], need: Point, *,
               explicit: bool) -> None:
    source = "--aux" if explicit else "the run's aux points (boundaries between b0 and bN)"
    labels = ", ".join(p.label for p in chosen) or "none"
    if any(p.is_final_norm for p in chosen):
        raise ExportError(f"{source}: final_norm cannot be an aux state (aux states are boundaries bK)")
    if need in chosen:
        raise ExportError(f"{source}: {need.label} is the layout's last slot and cannot also be an aux state")
    missing = [p.label for p in chosen if p not in captured]
    if missing:
        raise ExportError(f"{source}: {', '.join(missing)} not captured by this run "
                          f"(captured: {', '.join(p.label for p in captured)})")
    if layout.num_aux is not None and len(chosen) != layout.num_aux:
        raise ExportError(f"{source} = [{labels}]: the {layout.name} layout takes exactly {layout.num_aux} aux "
                          f"states, got {len(chosen)}; name {layout.num_aux} captured boundaries with --aux, e.g. "
                          f"--aux b1,b4,b7")
    if not chosen:
        raise ExportError(f"{source} = [{labels}]: the {layout.name} layout takes at least one aux state")


def _native_ids(points: Sequence[Point], framework: str, family: str, num_layers: int) -> dict[str, Any]:
    try:
        ids = to_native(list(points), framework=framework, family=family, num_layers=num_layers)
    except PointError as exc:
        return {"ids": None, "error": str(exc)}
    return {"ids": ids}


def serving_ids(plan: SlotPlan, *, model_type: str, num_layers: int) -> dict[str, Any]:
    """What a draft config must say, in SGLang's and vLLM's numbering for this model, to be served these features.
    A model whose numbering is unknown gets the reason instead of ids (the export itself does not depend on them)."""
    try:
        family = family_of(str(model_type))
    except PointError as exc:
        return {framework: {"aux_layer_ids": None, "last": None, "error": str(exc)} for framework in ("sglang", "vllm")}
    out: dict[str, Any] = {}
    for framework in ("sglang", "vllm"):
        aux = _native_ids(plan.aux, framework, family, num_layers)
        last = _native_ids([plan.last], framework, family, num_layers)
        last_id = None if last["ids"] is None else last["ids"][0]
        out[framework] = {"aux_layer_ids": aux["ids"], "last": last_id,
                          **({"aux_error": aux["error"]} if "error" in aux else {})}
    if plan.last.is_final_norm:
        how = (" divided by the final-norm weight (the trainer's target, never fed to a draft)"
               if plan.last_unnormed else " (no layer id)")
        out["sglang"]["note"] = f"eagle3 layers_to_capture; the last slot is SGLang's post-norm output{how}"
        out["vllm"]["note"] = f"id k = boundary k; the last slot is vLLM's post-norm output{how}"
    else:
        # A server feeds a draft only its aux states; the last slot is the trainer's target, which no server feeds.
        feeds = (f"SGLang feeds a draft only its aux states (aux_layer_ids {out['sglang']['aux_layer_ids']})"
                 if out["sglang"]["aux_layer_ids"] is not None else
                 "SGLang feeds a draft only its aux states, and cannot select these (aux_error)")
        out["sglang"]["note"] = (f"{feeds}; the last slot bN is the trainer's target, never fed to a draft; SGLang "
                                 "0.5.23 cannot capture bN (last is null): capture it with HF or vLLM, or export an "
                                 "SGLang run's final_norm with --last final_norm")
        out["vllm"]["note"] = "id k = boundary k (0 = embedding output, N = last layer output before the norm)"
    return out
