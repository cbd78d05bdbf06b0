"""The report's "Throughput by world size": what a training run reached at each size it
trained at, against what the search measured for the entry each size ran
(``orchestrator.config.size_entries``), step by step and per size; a size well below its own
searched
figure is marked, as the run log and the doctor flag it."""

from __future__ import annotations

from typing import Any

from matplotlib import colormaps

from orchestrator.report.html import figure, fmt, html_table, missing, png
from orchestrator.runfiles import (
    BELOW_SEARCHED,
    PROGRESS_CSV,
    RunRecord,
    below_searched,
    num,
    setting_text,
)


def section_by_size(record: RunRecord) -> str:
    """samples/s over the steps, one colour per world size, the searched figure of each
    size's own entry dashed; then the table of ``summary.json``'s ``by_size``."""
    points: dict[int, list[tuple[float, float]]] = {}
    searched: dict[int, float] = {}
    for row in record.progress:
        step, rate, world = (
            num(row.get("step")),
            num(row.get("samples_per_s")),
            num(row.get("world_size")),
        )
        if step is None or rate is None or world is None:
            continue
        points.setdefault(int(world), []).append((step, rate))
        figure_s, entry = num(row.get("searched_samples_per_s")), num(row.get("entry_size"))
        if figure_s is not None and entry == world:
            searched[int(world)] = figure_s
    if not points:
        return missing(f"No training run folder with {PROGRESS_CSV} (--train DIR2 or DIR/train).")
    fig, ax = figure(8.0, 3.2)
    shade = colormaps["tab10"]
    for i, (world, series) in enumerate(sorted(points.items())):
        ax.scatter(*zip(*series, strict=True), s=6, color=shade(i), label=f"{world} workers")
        if world in searched:
            ax.axhline(searched[world], color=shade(i), ls="--", lw=1)
    ax.set(xlabel="step", ylabel="global samples/s")
    ax.legend(fontsize="x-small")
    note = "<p>Dashed: what the search measured for the entry a size ran, at that size.</p>"
    body = png(fig, "samples/s by world size") + (note if searched else "") + _table(record)
    return body + _tune_table(record)


def _table(record: RunRecord) -> str:
    sizes = record.summary.by_size or []
    if not sizes:
        return ""
    low = {size["world_size"] for size, _ in below_searched(sizes)}
    rows = []
    for size in sizes:
        world, trained = num(size.get("world_size")), num(size.get("samples_per_s"))
        figure_s = num(size.get("searched_samples_per_s"))
        share = f"{trained / figure_s:.0%}" if trained and figure_s else ""
        mark = f" (below {BELOW_SEARCHED:.0%})" if world in low else ""
        rows.append([fmt(world, "g"), fmt(num(size.get("steps")), "g"), fmt(trained, ".1f"),
                     fmt(num(size.get("entry_size")), "g"), fmt(figure_s, ".1f"),
                     share + mark])  # fmt: skip
    header = ["world size", "steps", "trained samples/s", "entry", "searched", "trained/searched"]
    return html_table(header, rows)


def _tune_table(record: RunRecord) -> str:
    """``--tune``'s account per world size (``summary.json``'s ``tune``): the setting kept, each
    candidate's decision with its ratio and interval, and what the candidates that were not
    kept cost. A folder from elsewhere may hold anything there: what is not as written is
    shown blank."""
    sizes = (record.summary.tune or {}).get("sizes")
    if not isinstance(sizes, dict) or not sizes:
        return ""
    rows = []
    for world, size in sizes.items():
        size = size if isinstance(size, dict) else {}
        lost = size.get("lost") if isinstance(size.get("lost"), dict) else {}
        decisions = size.get("decisions") if isinstance(size.get("decisions"), list) else []
        judged = "; ".join(_decision(d) for d in decisions if isinstance(d, dict))
        rows.append([str(world), _setting(size.get("running")), str(size.get("outcome", "")),
                     judged, fmt(num(lost.get("steps")), "g"), fmt(num(lost.get("seconds")), ".1f"),
                     fmt(num(lost.get("extra_s")), "+.1f")])  # fmt: skip
    header = ["world size", "setting kept", "tuning", "candidates judged",
              "steps not kept", "their seconds", "against the running split"]  # fmt: skip
    return "<h3>Tuning while training (--tune)</h3>" + html_table(header, rows)


def _setting(value: Any) -> str:
    """A setting as ``setting_text`` writes it; blank where it is not one (a hand edit)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = {"accumulation_steps": value}  # a summary written before buckets were tuned
    try:
        return setting_text({k: float(v) for k, v in value.items()})
    except (AttributeError, TypeError, ValueError, OverflowError):
        return ""


def _decision(decision: dict) -> str:
    """One candidate's decision: ``accumulation 4: keep 1.081x (1.031-1.133, 5 pairs)``;
    ``buckets 10 MB: interrupted, no pair measured`` where none was."""
    head = f"{_setting(decision.get('candidate'))}: {decision.get('outcome')}"
    if not decision.get("pairs"):
        return f"{head}, no pair measured"
    ratio, low, high = (num(decision.get(k)) for k in ("ratio", "low", "high"))
    interval = f"{fmt(low, '.3f')}-{fmt(high, '.3f')}, " if high is not None else ""
    return f"{head} {fmt(ratio, '.3f')}x ({interval}{decision.get('pairs')} pairs)"
