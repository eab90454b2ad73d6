"""All checks of one draft against one serving setup and the target's facts, in the order a person reads them."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pipeline.drafts import features, fit, residual
from pipeline.drafts.checkpoint import Draft, read_draft
from pipeline.drafts.flags import Flags, parse
from pipeline.drafts.report import Finding
from pipeline.drafts.serving import ServerView, view
from pipeline.drafts.target import Target, TargetError, gather
from pipeline.points import PointError, family_of

# (draft, server view, target) -> findings of the engine-side weight load; None: not run
WeightsCheck = Callable[[Draft, ServerView, Target], list[Finding]]


@dataclass(kw_only=True)
class Request:
    draft: Path
    serve: str
    run: Path | str | None = None
    export: Path | str | None = None
    target: Path | None = None
    serve_version: str | None = None
    server_args: str | None = None


def facts(request: Request) -> tuple[Draft, Target, Flags | None]:
    """Everything read from disk; DraftError / TargetError / FlagsError (usage errors) name what is wrong."""
    draft = read_draft(request.draft)
    target = gather(run=request.run, export=request.export, model_dir=request.target)
    if target.num_layers is None or target.model_type is None:
        raise TargetError("the target is unknown: pass --run RUN_DIR, --export EXPORT_DIR or --target MODEL_DIR")
    try:
        family_of(target.model_type)
    except PointError as exc:
        raise TargetError(f"target model_type {target.model_type!r}: {exc}") from None
    flags = parse(request.server_args, request.serve) if request.server_args is not None else None
    return draft, target, flags


def examine(request: Request, weights: WeightsCheck | None = None) -> tuple[list[Finding], dict]:
    draft, target, flags = facts(request)
    server = view(draft, request.serve, model_type=target.model_type, architecture=target.architecture,
                  version=request.serve_version)
    found: list[Finding] = [features.check_capture(server, target.hidden_size)]
    found += features.check_aux_ids(draft, server, target)
    found += features.check_fc(draft, server, target)
    found.append(fit.check_finite(draft))
    if weights is not None:
        found += weights(draft, server, target)
    found.append(fit.check_hidden(draft, target))
    found += fit.check_vocab(draft, target)
    found.append(fit.check_d2t(draft, target))
    found.append(features.check_final_norm(draft, target))
    found.append(features.check_norm_output(draft))
    found += residual.check_norm_before_residual(draft, server)
    found += fit.check_flags(flags, server, draft)
    found.append(fit.check_kernels(target, server, flags))
    if (answers := fit.check_answers(target, server)) is not None:
        found.append(answers)
    context = {"draft": {"path": str(draft.path), "format": draft.format, "architecture": draft.architecture},
               "serve": {"framework": server.framework, "version": server.version, "draft_class": server.draft_class,
                         "numbering": server.numbering.source},
               "target": {"model_type": target.model_type, "architecture": target.architecture,
                          "num_layers": target.num_layers, "hidden_size": target.hidden_size,
                          "vocab_size": target.vocab_size, "sources": target.sources}}
    return found, context
