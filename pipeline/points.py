"""Canonical capture points and their translation to each framework's native ids.

Canonical convention (one for the whole project, independent of any framework):
- boundary `b` in 0..N: the residual stream after `b` decoder layers (hidden + residual, before any norm);
  `b0` is the embedding output, `bN` the last layer's output before the final norm;
- `final_norm`: the output of the model's final norm (what the LM head reads).

Native numberings differ by framework, version and even model class (docs/engines.md#the-convention-zoo). Each is
written down here once, as data plus a pair of functions. A table is only a claim: the diff stage verifies it on the
real engine.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

FINAL_NORM = "final_norm"
FAMILIES = ("llama", "deepseek")
_LABEL = re.compile(r"^b(\d+)$")
_ALIASES = {"embed": 0, "embedding": 0, "embeddings": 0}


class PointError(ValueError):
    """A capture point that does not exist, is out of range, or cannot be expressed in a framework's ids."""


@dataclass(frozen=True, order=True)
class Point:
    """A canonical capture point; `boundary is None` means the final norm's output."""

    boundary: int | None

    @property
    def label(self) -> str:
        return FINAL_NORM if self.boundary is None else f"b{self.boundary}"

    @property
    def is_final_norm(self) -> bool:
        return self.boundary is None

    def __str__(self) -> str:
        return self.label


def _sort_key(point: Point) -> tuple[int, int]:
    return (1, 0) if point.boundary is None else (0, point.boundary)


def parse_point(value: int | str, *, num_layers: int) -> Point:
    """Parse one canonical point: an int boundary, "b3", "embed", "last" (= bN) or "final_norm"."""
    if isinstance(value, bool):
        raise PointError(f"capture point {value!r} is not a boundary index or label")
    if isinstance(value, int):
        boundary = value
    elif isinstance(value, str) and value.strip().lower() == FINAL_NORM:
        return Point(None)
    elif isinstance(value, str) and value.strip().lower() == "last":
        boundary = num_layers
    elif isinstance(value, str) and value.strip().lower() in _ALIASES:
        boundary = _ALIASES[value.strip().lower()]
    elif isinstance(value, str) and (m := _LABEL.match(value.strip()) or re.match(r"^(\d+)$", value.strip())):
        boundary = int(m.group(1))
    else:
        raise PointError(f"capture point {value!r} is not understood; use a boundary 0..{num_layers} "
                         f"(int or 'b<k>'), 'embed', 'last' or '{FINAL_NORM}'")
    if not 0 <= boundary <= num_layers:
        raise PointError(f"capture point {value!r} is out of range: this model has {num_layers} decoder layers, "
                         f"so boundaries are 0..{num_layers} (0 = embedding output, {num_layers} = last layer output)")
    return Point(boundary)


def canonical_order(points: Iterable[Point]) -> list[Point]:
    """Boundaries ascending, final_norm last; duplicates are an error (they would silently waste a slot)."""
    points = list(points)
    seen = set()
    for p in points:
        if p in seen:
            raise PointError(f"capture point {p.label} is requested twice")
        seen.add(p)
    return sorted(points, key=_sort_key)


def parse_points(values: Sequence[int | str], *, num_layers: int) -> list[Point]:
    if not values:
        raise PointError("no capture points requested")
    return canonical_order(parse_point(v, num_layers=num_layers) for v in values)


def split_points(text: str) -> list[int | str]:
    """A point list written on a command line as `capture.points=` takes it: `b3,b31,final_norm` or `[3, 31, 59]`
    (brackets optional). A number is an int, as Hydra reads it (a boundary, or a native id under a convention); any
    other entry stays a label for `parse_point` or `resolve` to judge."""
    inner = text.strip().removeprefix("[").removesuffix("]")
    entries = [e.strip() for e in inner.split(",") if e.strip()]
    return [int(e) if re.fullmatch(r"-?\d+", e) else e for e in entries]


def family_of(model_type: str) -> str:
    """The model class family whose native numbering applies (SGLang numbers Llama and DeepSeek differently)."""
    mt = model_type.lower()
    if mt in {"deepseek_v2", "deepseek_v3", "kimi_k2", "kimi_k25"} or mt.startswith("deepseek"):
        return "deepseek"
    if mt in {"llama", "mistral", "qwen2", "qwen3"}:
        return "llama"
    raise PointError(f"model_type {model_type!r} has no known capture numbering; known families: {FAMILIES}")


# --- native conventions ---------------------------------------------------------------------------------------------
# Each convention maps one canonical point to one native id (None: not capturable natively) and back.
# `shift` is the native-to-canonical offset for decoder-layer ids; `final` is the native id of the post-norm state.


@dataclass(frozen=True)
class Convention:
    framework: str
    meaning: str  # what native id k means, in words (goes into provenance)
    shift: int  # boundary = id + shift
    min_boundary: int  # lowest boundary reachable through an id
    max_boundary_from_end: int  # highest boundary = N - this
    final: int | str | None  # native id of the final-norm output, None when not an id ("N" = HF index N)

    def max_boundary(self, num_layers: int) -> int:
        return num_layers - self.max_boundary_from_end

    def final_id(self, num_layers: int) -> int | None:
        return num_layers if self.final == "N" else self.final


CONVENTIONS: dict[str, Convention] = {
    "canonical": Convention("canonical", "boundary k", 0, 0, 0, None),
    "hf": Convention("hf", "output_hidden_states index k = boundary k; index N is post-norm", 0, 0, 1, "N"),
    "vllm": Convention("vllm", "id k = boundary k (0 = embedding, N = last layer pre-norm)", 0, 0, 0, None),
    "sglang-llama": Convention("sglang-llama", "SGLang 0.5.23 Llama aux id k = boundary k+1", 1, 1, 1, None),
    "sglang-deepseek": Convention(
        "sglang-deepseek", "SGLang 0.5.23 DeepSeek aux id k = boundary k, but every id +1 when the first id is 1",
        0, 0, 1, None),
    "speculators": Convention("speculators", "legacy worker: id k = after layer k = boundary k+1", 1, 1, 0, None),
    "speculators-0.9": Convention(
        "speculators-0.9", "speculators 0.9 eagle_aux_hidden_state_layer_ids: vLLM's ids, id k = boundary k "
        "(N = last layer pre-norm)", 0, 0, 0, None),
    "specforge": Convention("specforge", "aux id k = boundary k+1 (as passed to SGLang Llama); post-norm target",
                            1, 1, 0, None),
    "trtllm": Convention("trtllm", "SaveHiddenStates id k = boundary k+1; -1 = post-norm", 1, 1, 0, -1),
}
FRAMEWORKS = ("canonical", "hf", "vllm", "sglang", "speculators", "speculators-0.9", "specforge", "trtllm")


def convention_for(framework: str, family: str) -> Convention:
    if framework == "sglang":
        if family not in FAMILIES:
            raise PointError(f"SGLang numbering for model family {family!r} is unknown; known: {FAMILIES}")
        return CONVENTIONS[f"sglang-{family}"]
    if framework not in CONVENTIONS:
        raise PointError(f"capture convention {framework!r} is unknown; known: {', '.join(FRAMEWORKS)}")
    return CONVENTIONS[framework]


def to_native(points: Sequence[Point], *, framework: str, family: str, num_layers: int) -> list[int | None]:
    """Native id of each point, in order; None where the framework has no id for it (taken another way)."""
    conv = convention_for(framework, family)
    ids: list[int | None] = []
    for p in points:
        if p.is_final_norm:
            ids.append(conv.final_id(num_layers))
        elif conv.min_boundary <= p.boundary <= conv.max_boundary(num_layers):
            ids.append(p.boundary - conv.shift)
        else:
            ids.append(None)
    if conv.framework == "sglang-deepseek":
        layer_ids = [i for p, i in zip(points, ids) if i is not None and not p.is_final_norm]
        if layer_ids and layer_ids[0] == 1:
            raise PointError(
                "SGLang 0.5.23 (DeepSeek) adds +1 to every aux id when the first id is 1, so boundary 1 cannot be "
                "the first aux point; also capture boundary 0 (the embedding) or start from another boundary")
    return ids


def from_native(ids: Sequence[int], *, framework: str, family: str, num_layers: int) -> list[Point]:
    """Canonical points selected by a list of native ids (what a framework's config really captures)."""
    conv = convention_for(framework, family)
    ids = list(ids)
    shift = conv.shift
    if conv.framework == "sglang-deepseek" and ids and ids[0] == 1:
        shift = 1  # the quirk: the whole list moves by one
    points = []
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int):
            raise PointError(f"{framework} id {i!r} is not an integer")
        final = conv.final_id(num_layers)
        if final is not None and i == final:
            points.append(Point(None))
            continue
        b = i + shift
        if not conv.min_boundary <= b <= conv.max_boundary(num_layers):
            lo, hi = conv.min_boundary - shift, conv.max_boundary(num_layers) - shift
            raise PointError(f"{framework} id {i} is out of range for a {num_layers}-layer model "
                             f"({conv.meaning}; valid ids {lo}..{hi}"
                             + (f" and {final} for the final norm)" if final is not None else ")"))
        points.append(Point(b))
    return canonical_order(points)


def resolve(values: Sequence[int | str], *, convention: str, family: str, num_layers: int) -> list[Point]:
    """Points from a config: canonical labels, or native ids of a named framework."""
    if convention == "canonical":
        return parse_points(values, num_layers=num_layers)
    finals = [v for v in values if isinstance(v, str) and v.strip().lower() == FINAL_NORM]
    ids = [v for v in values if v not in finals]
    points = from_native(ids, framework=convention, family=family, num_layers=num_layers)
    return canonical_order(points + [Point(None)] * len(finals))


# --- which numbering a server or trainer applies: by framework, version and model class ----------------------------
# A row names the versions whose source it was read from and, where a model class numbers its own way (a wrapper that
# delegates to its language model), that class; otherwise it applies to a model family. Every server here captures the
# boundaries DEFAULT_AUX (2, N//2, N-3: SGLang sets layers_to_capture to them, vLLM's
# get_eagle3_default_aux_hidden_state_layers returns them) when the draft config names no ids it reads.


@dataclass(frozen=True)
class Numbering:
    framework: str
    versions: tuple[str, ...]  # the versions whose source this row was read from
    family: str | None  # None: every family
    architectures: tuple[str, ...]  # model classes this row is for; empty: any class of the family
    convention: str  # key of CONVENTIONS
    source: str  # where the numbering happens, in the framework's code


NUMBERINGS: tuple[Numbering, ...] = (
    Numbering("sglang", ("0.5.23",), "llama", (), "sglang-llama",
              "LlamaForCausalLM.set_eagle3_layers_to_capture: layers_to_capture = [id + 1]"),
    Numbering("sglang", ("0.5.23",), "deepseek", (), "sglang-deepseek",
              "DeepseekV2ForCausalLM.set_eagle3_layers_to_capture: ids as given, all +1 when the first id is 1"),
    Numbering("sglang", ("0.5.23",), "deepseek", ("KimiK25ForConditionalGeneration",), "sglang-deepseek",
              "KimiK25ForConditionalGeneration.set_eagle3_layers_to_capture delegates to language_model "
              "(DeepseekV2ForCausalLM): ids as given, all +1 when the first id is 1"),
    Numbering("vllm", ("0.32.0",), None, (), "vllm",
              "SupportsEagle3.set_aux_hidden_state_layers: id k = residual stream after k layers"),
    Numbering("vllm", ("0.32.0",), "deepseek", ("KimiK25ForConditionalGeneration",), "vllm",
              "KimiK25ForConditionalGeneration.set_aux_hidden_state_layers delegates to language_model "
              "(DeepseekV2ForCausalLM): id k = boundary k"),
    Numbering("speculators", ("0.9.0",), None, (), "speculators-0.9",
              "Eagle3SpeculatorConfig.eagle_aux_hidden_state_layer_ids (models/utils.resolve_target_layer_ids)"),
)


def default_aux_boundaries(num_layers: int) -> list[Point]:
    """What SGLang 0.5.23 and vLLM 0.32 capture when a draft config names no aux ids they read."""
    return [Point(b) for b in (2, num_layers // 2, num_layers - 3)]


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version)[:3])


def numbering_for(framework: str, *, model_type: str, architecture: str | None = None,
                  version: str | None = None) -> tuple[Numbering, bool]:
    """The row that applies, and whether `version` is one it was read from (False: the nearest older version's row,
    or the oldest when `version` predates every row: a claim to verify, not a fact)."""
    family = family_of(model_type)
    rows = [r for r in NUMBERINGS if r.framework == framework and r.family in (None, family)]
    if not rows:
        known = sorted({r.framework for r in NUMBERINGS})
        raise PointError(f"no serving numbering for {framework!r}; known: {', '.join(known)}")
    by_class = [r for r in rows if architecture and architecture in r.architectures]
    rows = by_class or [r for r in rows if not r.architectures]
    if version is None:
        exact = []
    else:
        exact = [r for r in rows if any(version_key(v) == version_key(version) for v in r.versions)]
    if exact:
        return exact[0], True
    want = version_key(version) if version else (1 << 30,)
    older = [r for r in rows if max(version_key(v) for v in r.versions) <= want]
    if older:
        return max(older, key=lambda r: max(version_key(v) for v in r.versions)), False
    return min(rows, key=lambda r: min(version_key(v) for v in r.versions)), False
