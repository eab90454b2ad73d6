"""`norm_before_residual`: whether the first draft layer keeps the residual before or after its `hidden_norm`.
What each trainer trained with and what each server applies, read from their released source:

- speculators 0.9 trains with the top-level `norm_before_residual` of Eagle3SpeculatorConfig (its training CLI's
  default is true, train/config/schema.py; the config class's default when the key is absent is false,
  models/eagle3/config.py; models/eagle3/model_definitions.py applies it).
- SpecForge 0.2.0's `LlamaForCausalLMEagle3` (modeling/draft/llama3_eagle.py) never reads the key: residual =
  hidden_states, then hidden_norm, whatever the config says (false).
- SGLang 0.5.23 ignores the key in both EAGLE-3 drafts: models/llama_eagle3.py and kimi_k25_eagle3.py keep
  `residual = hidden_states` before `hidden_norm` (false, always).
- vLLM 0.32 honours it (model_executor/models/llama_eagle3.py and deepseek_eagle3.py: `getattr(config,
  "norm_before_residual", False)`); a speculators config reaches it through its converter, which defaults an absent
  key to true (transformers_utils/configs/speculators/algos.py update_eagle3).
"""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.drafts.checkpoint import Draft
from pipeline.drafts.report import Finding
from pipeline.drafts.serving import ServerView
from pipeline.points import version_key


@dataclass(frozen=True)
class ResidualRule:
    framework: str
    versions: tuple[str, ...]  # the versions whose source this row was read from
    schemas: tuple[str, ...]  # draft schemas (pipeline/drafts/checkpoint.FORMATS) the row is for
    honours: bool  # False: the server applies norm-after-residual whatever the config says
    absent: bool  # what the server applies when the config has no norm_before_residual
    source: str


# The one table of which server honours the flag (by server, version and the draft schema it reads).
RULES: tuple[ResidualRule, ...] = (
    ResidualRule("sglang", ("0.5.23",), ("specforge", "speculators", "mla"), False, False,
                 "models/llama_eagle3.py / kimi_k25_eagle3.py: residual = hidden_states before hidden_norm, the key "
                 "never read"),
    ResidualRule("vllm", ("0.32.0",), ("specforge", "mla"), True, False,
                 "models/llama_eagle3.py / deepseek_eagle3.py: getattr(config, 'norm_before_residual', False)"),
    ResidualRule("vllm", ("0.32.0",), ("speculators",), True, True,
                 "configs/speculators/algos.py update_eagle3 copies the top-level key (absent: true) into the config "
                 "llama_eagle3.py reads"),
)


def rule_for(framework: str, schema: str, version: str) -> tuple[ResidualRule, bool]:
    """The row that applies and whether `version` is one it was read from (False: the nearest older row's, or the
    oldest row's when the version predates them all)."""
    rows = [r for r in RULES if r.framework == framework and schema in r.schemas]
    exact = [r for r in rows if any(version_key(v) == version_key(version) for v in r.versions)]
    if exact:
        return exact[0], True
    older = [r for r in rows if max(map(version_key, r.versions)) <= version_key(version)]
    pick = max(older, key=lambda r: max(map(version_key, r.versions))) if older else \
        min(rows, key=lambda r: min(map(version_key, r.versions)))
    return pick, False


def trained_with(draft: Draft) -> tuple[bool, str]:
    """What the draft's trainer applied, and where that was read."""
    value = draft.norm_before_residual
    if draft.format == "speculators":
        if value is None:
            return False, "config.json has no norm_before_residual (speculators' Eagle3SpeculatorConfig default false)"
        return value, "config.json norm_before_residual (top level, where speculators reads it)"
    if value is None:
        return False, "config.json has no norm_before_residual (false: SpecForge 0.2.0 never applies it)"
    return value, ("config.json norm_before_residual (a draft converted from speculators carries the value it was "
                   "trained with; SpecForge 0.2.0's trainer ignores the key, so a SpecForge draft should not set it)")


def served_with(draft: Draft, rule: ResidualRule) -> tuple[bool, str]:
    """What the server applies under `rule`, and why, in words."""
    if not rule.honours:
        return False, f"ignores norm_before_residual ({rule.source})"
    if draft.norm_before_residual is None:
        return rule.absent, f"reads no norm_before_residual, so applies {str(rule.absent).lower()} ({rule.source})"
    return draft.norm_before_residual, f"honours config.json norm_before_residual ({rule.source})"


def _word(before: bool) -> str:
    return "norm before residual (true)" if before else "norm after residual (false)"


def check_norm_before_residual(draft: Draft, view: ServerView) -> list[Finding]:
    name = f"{view.framework} {view.version}"
    # run even when the server cannot read the schema (aux-capture says so): converting the config to its layout
    # would not change what the server applies
    rule, known = rule_for(view.framework, draft.format, view.version)
    out = [] if known else [Finding("WARN", "norm-before-residual", f"{name}: whether it honours "
                                    f"norm_before_residual was not read from this version's source; using "
                                    f"{rule.versions[-1]}'s ({rule.source})")]
    trained, where = trained_with(draft)
    served, how = served_with(draft, rule)
    if served == trained:
        out.append(Finding("OK", "norm-before-residual", f"{name} {how}: {_word(served)}, what the drafter was trained "
                           f"with ({where})"))
        return out
    fix = (f"serve it with vLLM (0.32 honours the key) or retrain with norm_before_residual {str(served).lower()}"
           if not rule.honours else
           f"set norm_before_residual to {str(trained).lower()} in config.json")
    out.append(Finding("MISMATCH", "norm-before-residual", f"{name} {how}: its first draft layer runs "
                       f"{_word(served)} but the drafter was trained with {_word(trained)} ({where}), so every step "
                       f"is fed other inputs than in training; {fix}"))
    return out
