"""The report page's primitives: escaping, tables, and matplotlib figures as inline PNGs."""

from __future__ import annotations

import base64
import html
import io
import logging

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

FAILED_STATES = ("corrupt", "oom", "hang", "crash", "infeasible", "interrupted", "error")
REPEAT_STATE = "repeat"
"""The state of a trial the search never ran: a configuration the sampler asked for again."""
PART_COLORS = {
    "data": "#8c564b",
    "compute": "#1f77b4",
    "exposed comm": "#d62728",
    "optimizer": "#2ca02c",
    "other": "#bbbbbb",
}
STYLE = """
body { font-family: system-ui, sans-serif; max-width: 60rem; margin: 2rem auto; padding: 0 1rem;
       color: #222; line-height: 1.45; }
h1 { margin-bottom: 0.2rem; } h2 { border-bottom: 1px solid #ddd; margin-top: 2.2rem; }
.meta { color: #555; } .missing { color: #777; font-style: italic; }
img { max-width: 100%; } pre { background: #f6f6f6; padding: 0.6rem; overflow-x: auto; }
table { border-collapse: collapse; font-size: 0.9rem; } td, th { padding: 0.15rem 0.6rem;
       border-bottom: 1px solid #eee; text-align: left; }
.high { color: #b00020; } .medium { color: #b36b00; } .info { color: #005a9c; }
"""

esc = html.escape
log = logging.getLogger("commtune")
# matplotlib's category axis logs every string-labelled bar chart at INFO: noise in a CLI.
logging.getLogger("matplotlib.category").setLevel(logging.WARNING)


def missing(text: str) -> str:
    return f'<p class="missing">{esc(text)}</p>'


def figure(width: float = 8.0, height: float = 3.4) -> tuple[Figure, Axes]:
    """A Figure on an explicit Agg canvas: no pyplot global state, no display needed."""
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots()


def png(fig: Figure, alt: str) -> str:
    """The figure as an inline data URI, so the page needs nothing beside it."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img alt="{esc(alt)}" src="data:image/png;base64,{data}">'


def html_table(header: list[str], rows: list[list[object]]) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def fmt(value: float | None, spec: str = ".4g") -> str:
    return "" if value is None else format(value, spec)


def bar_chart(bars: list[tuple[str, float, float]]) -> str:
    fig, ax = figure(6.0, 0.6 + 0.5 * len(bars))
    labels, values, errs = zip(*bars, strict=True)
    ax.barh(labels, values, xerr=errs, color=["#888888", *["#1f77b4"] * (len(bars) - 1)], capsize=4)
    ax.invert_yaxis()
    ax.set(xlabel="global samples/s (error bar: spread)")
    return png(fig, "best vs baseline")
