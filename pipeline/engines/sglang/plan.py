"""Which SGLang output each canonical point comes from: pure data, no SGLang import (testable anywhere).

SGLang 0.5.23 captures an eagle3 aux state at the *input* of decoder layer L (the residual stream after L layers,
i.e. canonical boundary L) for every L in the model's `layers_to_capture`, packed in ascending layer order. The
native ids in `return_aux_hidden_state_layer_ids` become `layers_to_capture` differently per model class
(`pipeline.points`: Llama adds 1 to every id; DeepSeek adds 1 to every id only when the first id is 1). So:
- boundaries 1..N-1 (Llama) and 0..N-1 (DeepSeek) come from the aux capture;
- b0 on Llama comes from an exact lookup in the checkpoint's embedding table (Llama's aux capture cannot record it);
  on DeepSeek from native id 0, which also keeps a list that would start with 1 from being shifted;
- bN (the last layer's output before the final norm) cannot be captured: nothing follows the last layer;
- final_norm is the post-norm state the LM head reads (`LogitsProcessorOutput.last_hidden_states`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from pipeline.core.contracts import PointSource
from pipeline.points import Point, PointError, convention_for, from_native, to_native

AUX, TABLE, FINAL = "aux", "embedding_table", "final_norm"
_FINAL_METHOD = ("SGLang LogitsProcessorOutput.last_hidden_states: the final norm's output the LM head reads "
                 "(what return_hidden_states returns without aux capture)")
_TABLE_METHOD = ("exact lookup of the token ids in the checkpoint's embedding table ({key}), in the compute dtype; "
                 "SGLang's {family} aux capture does not record the embedding here")


@dataclass(frozen=True, kw_only=True)
class PointPlan:
    point: Point
    source: str  # AUX, TABLE or FINAL
    column: int | None = None  # index into the packed aux capture (AUX only)
    native_id: int | None = None


@dataclass(frozen=True, kw_only=True)
class CapturePlan:
    family: str
    aux_layer_ids: list[int]  # what SGLang is given, verbatim
    layers_to_capture: list[int]  # what the model must report after loading (= the boundaries captured)
    points: list[PointPlan]
    anchor: bool  # aux id 0 captured only to keep DeepSeek from shifting the list, then dropped

    def needs(self, source: str) -> bool:
        return any(p.source == source for p in self.points)

    def sources(self, embedding_key: str | None) -> list[PointSource]:
        meaning = convention_for("sglang", self.family).meaning
        out = []
        for p in self.points:
            if p.source == AUX:
                method = (f"SGLang eagle3 aux capture: return_aux_hidden_state_layer_ids={self.aux_layer_ids} "
                          f"({meaning}), id {p.native_id} = input of decoder layer {p.point.boundary}, "
                          f"packed column {p.column}")
            elif p.source == TABLE:
                method = _TABLE_METHOD.format(key=embedding_key, family=self.family)
            else:
                method = _FINAL_METHOD
            out.append(PointSource(point=p.point.label, native_id=p.native_id, method=method))
        return out


def _check_last(points: Sequence[Point], family: str, num_layers: int) -> None:
    if any(p.boundary == num_layers for p in points):
        raise PointError(
            f"capture point b{num_layers} (the last layer's output before the final norm) cannot be captured by "
            f"SGLang 0.5.23 ({family} model class): its aux capture records a decoder layer's input, and no layer "
            f"follows the last one. Nothing else is substituted for it: drop it from capture.points, or capture "
            f"'final_norm' (the post-norm state) or b{num_layers - 1}, or use another engine (hf, vllm)")


def _boundaries_of(ids: list[int], family: str, num_layers: int) -> list[int]:
    """The boundary each native id captures (ids ascending, so `from_native`'s sorted result lines up)."""
    if any(isinstance(i, bool) or not isinstance(i, int) for i in ids) or ids != sorted(set(ids)):
        raise PointError(f"engine.options.aux_layer_ids={ids!r}: must be distinct integers in ascending order "
                         f"(SGLang packs captures in layer order)")
    return [p.boundary for p in from_native(ids, framework="sglang", family=family, num_layers=num_layers)]


def _default_ids(boundaries: list[Point], family: str, num_layers: int) -> tuple[list[int | None], bool]:
    """Native ids per boundary point; DeepSeek lists that would start with 1 get an anchor id 0 first."""
    anchor = family == "deepseek" and Point(1) in boundaries and Point(0) not in boundaries
    points = ([Point(0)] if anchor else []) + boundaries
    return to_native(points, framework="sglang", family=family, num_layers=num_layers), anchor


def make_plan(points: Sequence[Point], *, family: str, num_layers: int,
              aux_layer_ids: Sequence[int] | None = None) -> CapturePlan:
    """Points in request order; `aux_layer_ids` passes a native list verbatim (e.g. a serving config's)."""
    _check_last(points, family, num_layers)
    boundaries = [p for p in points if not p.is_final_norm]
    if aux_layer_ids is not None:
        ids, anchor = list(aux_layer_ids), False
        captured = _boundaries_of(ids, family, num_layers)
    else:
        native, anchor = _default_ids(sorted(boundaries), family, num_layers)
        ids = [i for i in native if i is not None]
        captured = [b.boundary for b, i in zip(([Point(0)] if anchor else []) + sorted(boundaries), native)
                    if i is not None]
    wanted = {p.boundary for p in boundaries} | ({0} if anchor else set())
    extra = sorted(set(captured) - wanted)
    missing = sorted(b for b in wanted - set(captured) if b != 0)
    if extra or missing:
        raise PointError(f"engine.options.aux_layer_ids={ids!r} captures boundaries {captured} in SGLang's "
                         f"{family} numbering, but capture.points asks for {sorted(wanted)}: they must agree")
    plans = []
    for p in points:
        if p.is_final_norm:
            plans.append(PointPlan(point=p, source=FINAL))
        elif p.boundary in captured:
            column = captured.index(p.boundary)
            plans.append(PointPlan(point=p, source=AUX, column=column, native_id=ids[column]))
        else:  # b0 where the aux capture cannot record it
            plans.append(PointPlan(point=p, source=TABLE))
    return CapturePlan(family=family, aux_layer_ids=ids, layers_to_capture=captured, points=plans, anchor=anchor)
