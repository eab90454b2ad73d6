"""The report's pages: report.md and report.html (one self-contained file: the per-position chart embedded as PNG,
inline CSS, no scripts), the drafts side by side, one column each, the doctor's verdict beside the figures."""
from __future__ import annotations

from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from pipeline.acceptance.report import Report
from pipeline.core import plots

_TEMPLATE = Environment(loader=PackageLoader("pipeline.acceptance", "templates"), autoescape=True,
                        undefined=StrictUndefined).get_template("report.html.j2")


def _f(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def rows(report: Report) -> list[tuple[str, list[str]]]:
    """(label, one cell per draft), the table both pages show."""
    drafts = report.drafts
    k = report.settings.num_speculative_tokens
    table = [("doctor", [d.doctor.verdict for d in drafts]),
             ("acceptance length", [_f(d.overall.acceptance_length) for d in drafts])]
    table += [(f"accepted at position {i + 1}", [_f((d.overall.per_position or [None] * k)[i]) for d in drafts])
              for i in range(k)]
    table += [("draft-token acceptance", [_f(d.overall.draft_token_rate) for d in drafts]),
              ("tokens/s speculative", [_f(d.tokens_per_s, 1) for d in drafts]),
              ("tokens/s plain", [_f(report.plain.tokens_per_s, 1)] * len(drafts)),
              ("outputs differing from plain greedy", [f"{d.differing} of {len(d.prompts)}" for d in drafts])]
    return table


def _title(report: Report) -> str:
    return f"Acceptance: {len(report.drafts)} draft(s) on {report.provenance.target.path}"


def _settings(report: Report) -> str:
    s, p = report.settings, report.provenance
    return (f"vLLM {p.vllm_version}, {s.dtype}, K={s.num_speculative_tokens}, max_tokens={s.max_tokens}, "
            f"temperature={s.temperature}, {report.num_prompts} prompts ({p.prompts.path}); figures from "
            "vLLM's own spec-decode counters (report.json keeps them per prompt).")


def markdown(report: Report) -> str:
    drafts = report.drafts
    lines = ["| | " + " | ".join(f"`{d.name}`" for d in drafts) + " |", "|---|" + "---|" * len(drafts)]
    lines += [f"| {label} | " + " | ".join(cells) + " |" for label, cells in rows(report)]
    failed = [f"- `{f.name}` not measured (exit {f.exit_code}): {f.error}" for f in report.failed]
    return "\n".join([f"# {_title(report)}", "", _settings(report), "", *lines, "", *failed, *([""] if failed else [])])


def chart(report: Report) -> str:
    """Per-position acceptance, the drafts' bars side by side at each position, and each draft's acceptance length."""
    plt = plots.plt()
    drafts = report.drafts
    k = report.settings.num_speculative_tokens
    fig, (pos, length) = plt.subplots(1, 2, figsize=(10, 3.6), gridspec_kw={"width_ratios": [2, 1]})
    plots.margins(fig, left=0.7, bottom=0.75, top=0.4, wspace=0.35)
    width = 0.8 / max(1, len(drafts))
    for j, d in enumerate(drafts):
        values = d.overall.per_position or [0.0] * k
        pos.bar([i + 1 + (j - (len(drafts) - 1) / 2) * width for i in range(k)], values, width, label=d.name)
    pos.set_xticks(range(1, k + 1))
    pos.set_xlabel("draft position")
    pos.set_ylabel("accepted / draft steps")
    pos.set_ylim(0, 1)
    pos.set_title("acceptance per position", fontsize=10)
    pos.grid(axis="y", alpha=0.3)
    pos.legend(fontsize=8)
    lengths = [d.overall.acceptance_length or 1.0 for d in drafts]
    length.bar(range(len(drafts)), lengths, color=[f"C{j}" for j in range(len(drafts))])
    length.set_xticks(range(len(drafts)), [d.name for d in drafts], rotation=20, fontsize=8)
    length.set_ylim(1, k + 1)
    length.set_title("acceptance length (1 + accepted / drafts)", fontsize=10)
    length.grid(axis="y", alpha=0.3)
    return plots.png(fig, alt="per-position acceptance")


def html(report: Report) -> str:
    return _TEMPLATE.render(title=_title(report), settings=_settings(report), drafts=report.drafts,
                            failed=report.failed, rows=rows(report), chart=Markup(chart(report)),
                            provenance=report.provenance)
