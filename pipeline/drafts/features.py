"""Checks on the features: which boundaries the server captures for this draft, whether it captures at all, how wide
the drafter's input is, and which final state its trainer's loss was built on."""
from __future__ import annotations

from typing import Sequence

from pipeline.drafts.checkpoint import Draft
from pipeline.drafts.report import Finding
from pipeline.drafts.serving import ServerView
from pipeline.drafts.target import Features, Target
from pipeline.points import Point, PointError, default_aux_boundaries, family_of, from_native, to_native

# Which final state each trainer's loss reads (pipeline/exports: speculators applies the verifier's norm to bN itself,
# SpecForge's target head is the bare lm_head over the post-norm state). The MLA draft is trained by SpecForge.
TRAINER_OF = {"speculators": "speculators", "specforge": "specforge", "mla": "specforge"}
LAST_STATE = {"speculators": "bN", "specforge": "final_norm"}


def labels(points: Sequence[Point]) -> str:
    return ",".join(p.label for p in points) or "none"


def served_points(view: ServerView, target: Target) -> tuple[list[Point] | None, str]:
    """The canonical boundaries the server captures, or None and why not (ids it refuses)."""
    n = target.num_layers
    if view.ids is None:
        return default_aux_boundaries(n), f"its default boundaries (2, N//2, N-3) because it reads {view.ids_from}"
    try:
        family = family_of(target.model_type)
        return (from_native(view.ids, framework=view.numbering.convention, family=family, num_layers=n),
                f"ids {view.ids} from {view.ids_from}")
    except PointError as exc:
        return None, str(exc)


def trained_points(features: Features | None, num_aux: int | None, num_layers: int) -> tuple[list[Point] | None, str]:
    """The aux points the drafter was trained on: an export's aux slots, or a run's boundaries between b0 and bN when
    they are as many as the draft's fc takes (what `pipeline.export` picks by default)."""
    if features is None:
        return None, "no --run or --export: what the drafter was trained on is unknown"
    if features.aux is not None:
        return list(features.aux), features.source
    aux = [p for p in features.run_points if not p.is_final_norm and 0 < p.boundary < num_layers]
    if num_aux is not None and len(aux) == num_aux:
        return aux, f"{features.source}, its aux boundaries"
    return None, (f"{features.source} holds {labels(features.run_points)}, not the {num_aux} aux states the draft "
                  "takes: name the exported slots with --export")


def _ids_for(points: Sequence[Point], view: ServerView, target: Target) -> str:
    try:
        ids = to_native(list(points), framework=view.numbering.convention, family=family_of(target.model_type),
                        num_layers=target.num_layers)
    except PointError as exc:
        return f"no ids of {view.framework} {view.version} select them ({exc})"
    if None in ids:
        return f"{view.framework} {view.version} cannot capture {labels(points)} (ids {ids})"
    return f"set eagle_config.eagle_aux_hidden_state_layer_ids to {ids}"


def check_aux_ids(draft: Draft, view: ServerView, target: Target) -> list[Finding]:
    out = []
    served, how = served_points(view, target)
    name = f"{view.framework} {view.version}"
    if not view.version_known:
        out.append(Finding("WARN", "numbering", f"{name}: no numbering read from this version's source; using "
                           f"{view.numbering.versions[-1]}'s ({view.numbering.source}); verify it with "
                           "python -m pipeline.diff on this version before serving"))
    if served is None:
        then = ("it raises at the first forward" if view.framework == "sglang" else
                "its forward never reaches that layer index and captures fewer states than the draft takes")
        out.append(Finding("MISMATCH", "aux-ids", f"{name} cannot capture what the draft's aux ids name ({then}): "
                           f"{how}"))
        return out
    trained, where = trained_points(target.features, draft.fc_in // draft.input_width if draft.fc_in else None,
                                    target.num_layers)
    rule = f"{view.numbering.source}"
    if trained is None:
        out.append(Finding("WARN", "aux-ids", f"{name} will capture {labels(served)} ({how}; {rule}); {where}"))
    elif served == trained:
        out.append(Finding("OK", "aux-ids", f"{name} captures {labels(served)} ({how}), the points the drafter was "
                           f"trained on ({where})"))
    else:
        out.append(Finding("MISMATCH", "aux-ids", f"{name} will feed {labels(served)} ({how}; {rule}) but the "
                           f"drafter was trained on {labels(trained)} ({where}); {_ids_for(trained, view, target)}"))
    return out


def check_capture(view: ServerView, features_width: int | None) -> Finding:
    name = f"{view.framework} {view.version}"
    if view.draft_class is None:
        return Finding("MISMATCH", "aux-capture", f"{name} has no reader for this draft's config schema, so it "
                       "builds no EAGLE-3 draft from it; convert it to the SpecForge/SGLang layout "
                       "(LlamaForCausalLMEagle3, eagle_config.eagle_aux_hidden_state_layer_ids) or serve with vLLM")
    if not view.use_aux:
        return Finding("MISMATCH", "aux-capture", f"{view.eagle_config_from}.use_aux_hidden_state is false: {name} "
                       "captures no "
                       f"aux states and feeds the target's {features_width or 'H'}-wide post-norm last state, which "
                       "skips the draft's fc; the drafter was trained on concatenated aux states: remove "
                       "use_aux_hidden_state or set it true")
    return Finding("OK", "aux-capture", f"{name} switches aux capture on for this draft ({view.draft_class}, "
                   f"{view.eagle_config_from}.use_aux_hidden_state absent or true)")


def check_fc(draft: Draft, view: ServerView, target: Target) -> list[Finding]:
    out, fc_in = [], draft.fc_in
    hidden = target.hidden_size or draft.input_width
    served, _ = served_points(view, target)
    if fc_in is None:
        return [Finding("MISMATCH", "fc-width", f"fc.weight has shape {draft.tensors['fc.weight'].shape}: not a "
                        "[hidden, aux x hidden] matrix")]
    if view.draft_class is not None and fc_in != view.fc_in_expected:
        out.append(Finding("MISMATCH", "fc-width", f"{view.framework}'s {view.draft_class} builds fc for "
                           f"{view.num_aux_expected} x {draft.input_width} = {view.fc_in_expected} inputs (from "
                           f"num_aux_hidden_states / eagle_config ids / 3) but fc.weight takes {fc_in}: loading fails "
                           f"or drops it; set eagle_config.eagle_aux_hidden_state_layer_ids to {fc_in // hidden} ids"))
    fed = None if served is None else len(served) * hidden
    if fed is not None and fed != fc_in:
        out.append(Finding("MISMATCH", "fc-width", f"the server feeds {len(served)} aux states x {hidden} = {fed} "
                           f"values per token but fc.weight takes {fc_in} ({fc_in / hidden:g} states of {hidden})"))
    if not out:
        out.append(Finding("OK", "fc-width", f"fc takes {fc_in} = {fc_in // hidden} aux states x hidden {hidden}, "
                           "what the server feeds and builds"))
    return out


def check_final_norm(draft: Draft, target: Target) -> Finding:
    trainer = TRAINER_OF[draft.format]
    need = LAST_STATE[trainer]
    why = ("speculators applies the verifier's final norm to its last slot itself, so it must hold bN"
           if trainer == "speculators" else "SpecForge's target head is the bare lm_head, so its target must be the "
           "post-norm final_norm")
    feats = target.features
    if feats is None:
        return Finding("WARN", "final-norm", f"a {draft.format} draft is trained by {trainer} ({why}); no --run or "
                       "--export to check the shards against")
    n = target.num_layers
    need_point = Point(None) if need == "final_norm" else Point(n)
    if feats.trainer_format is not None and feats.trainer_format != trainer:
        return Finding("MISMATCH", "final-norm", f"the export is in the {feats.trainer_format} layout (last slot "
                       f"{feats.last.label if feats.last else '?'}) but this {draft.format} draft is trained by "
                       f"{trainer} ({why}): export the run with --format {trainer}")
    if feats.last_unnormed and trainer == "speculators" and feats.last is not None and feats.last.is_final_norm:
        return Finding("OK", "final-norm", f"{feats.source}'s last slot is final_norm divided by the final-norm "
                       f"weight (--last final_norm): {why}, and that norm maps it back to final_norm")
    if feats.last is not None and feats.last != need_point:
        return Finding("MISMATCH", "final-norm", f"the export's last slot is {feats.last.label} but {why}; "
                       f"{'the norm is applied twice' if feats.last.is_final_norm else 'the norm is never applied'}")
    if feats.last is None and need_point not in feats.run_points:
        return Finding("MISMATCH", "final-norm", f"{feats.source} holds no {need_point.label} ({why}); recapture with "
                       f"{need_point.label if need == 'final_norm' else 'last'} in capture.points")
    return Finding("OK", "final-norm", f"{trainer} trains on {need_point.label} ({why}), which {feats.source} holds")


def check_norm_output(draft: Draft) -> Finding:
    """`norm_output`: SGLang, vLLM and speculators feed the draft's post-norm state to its next step when true (EAGLE
    3.1), default false; SpecForge 0.2.0's draft reads the same key as whether its logits go through its norm (default
    true) and always feeds the pre-norm state back
    (docs/engines.md#eagle-3-drafts-what-sglang-0523-and-vllm-032-read)."""
    value = draft.norm_output
    if draft.format != "specforge":
        shown = "absent (false)" if value is None else str(value).lower()
        return Finding("OK", "draft-norm", f"norm_output {shown}, read from {draft.norm_output_from}: the same "
                       "meaning in the trainer and the servers (true: the post-norm state feeds the next draft step)")
    if value is None:
        return Finding("OK", "draft-norm", "no norm_output: SpecForge trained normed logits and pre-norm feedback, "
                       "what SGLang and vLLM serve by default")
    if value:
        return Finding("MISMATCH", "draft-norm", "config.json sets norm_output true: SpecForge 0.2.0 read it as "
                       "'logits through the draft's norm' and fed the pre-norm state to the next step, but the servers "
                       "read it as 'feed the post-norm state to the next step'; remove norm_output from the served "
                       "config")
    return Finding("MISMATCH", "draft-norm", "config.json sets norm_output false: SpecForge 0.2.0 trained logits "
                   "without the draft's final norm, but SGLang and vLLM always apply it before lm_head; retrain with "
                   "norm_output true (its default) and remove the key before serving")
