"""Plots drawn for the self-contained HTML reports (the diff report, the acceptance report): matplotlib on its file
backend, fixed margins, PNG embedded as a base64 <img> tag."""
from __future__ import annotations

import base64
import io

DPI = 72


def plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as pyplot

    return pyplot


def margins(fig, *, left: float, bottom: float, top: float, right: float = 0.25, wspace: float | None = None) -> None:
    """Fixed margins in inches: bbox_inches="tight" (or a constrained layout) draws every figure twice, and drawing
    is most of the report's plotting time (bench/README.md#figures-measured-outside-the-bench-scripts)."""
    w, h = fig.get_size_inches()
    fig.subplots_adjust(left=left / w, right=1 - right / w, bottom=bottom / h, top=1 - top / h, wspace=wspace)


def png(fig, alt: str = "plot") -> str:
    """The figure as an <img> tag (closed afterwards)."""
    from matplotlib.ticker import NullLocator

    for ax in fig.axes:  # minor ticks on wide log axes cost most of the drawing time, and say little
        ax.yaxis.set_minor_locator(NullLocator())
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    plt().close(fig)
    return f'<img alt="{alt}" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">'
