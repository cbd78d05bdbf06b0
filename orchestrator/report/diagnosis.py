"""Report sections that explain a run: step-time parts, bandwidth, gradients, findings."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from orchestrator import findings
from orchestrator.report.html import (
    PART_COLORS,
    esc,
    figure,
    fmt,
    html_table,
    missing,
    png,
)
from orchestrator.runfiles import (
    GRAD_NORMS_CSV,
    PROBE_CSV,
    TRAIN_DIR,
    TRIALS_CSV,
    RunRecord,
    num,
    read_csv,
)


def _parts(step: findings.StepParts) -> dict[str, float]:
    """Stacked parts in ms; compute falls back to fwd_bwd (sync included) when the split into
    compute and exposed communication was not measured."""
    compute = step.compute_s if step.compute_s is not None else step.fwd_bwd_s
    comm = step.exposed_comm_s if step.compute_s is not None else None
    parts = {
        "data": step.data_s,
        "compute": compute,
        "exposed comm": comm,
        "optimizer": step.optim_s,
    }
    parts = {k: v * 1e3 for k, v in parts.items() if v is not None}
    if step.step_time_s is not None:
        parts["other"] = max(0.0, step.step_time_s * 1e3 - sum(parts.values()))
    return parts


def section_step_time(record: RunRecord) -> str:
    """Baseline vs best split into data, compute, exposed comm, optimizer and the rest: shows
    which part the tuning removed (or that the gain was not where it was expected)."""
    steps = []
    base, best = record.baseline(), record.best()
    if base is not None:
        steps.append(
            findings.trial_step(
                base, "baseline (trial 0)" + (" = best" if best is base else ""), record
            )
        )
    if best is not None and best is not base:
        steps.append(findings.trial_step(best, f"best (trial {best['number']})", record))
    trained = findings.training_step(record)
    if trained is not None and trained.step_time_s is not None:
        steps.append(trained)
    scopes = "; ".join(f"{s.label}: {s.comm_scope}" for s in steps if s.sharded)
    steps = [(s.label, _parts(s)) for s in steps]
    steps = [(label, parts) for label, parts in steps if parts]
    if not steps:
        return missing(f"No completed trial with step-time parts ({TRIALS_CSV} missing or empty).")
    fig, ax = figure(8.0, 0.9 + 0.55 * len(steps))
    split = any("exposed comm" in parts for _, parts in steps)
    labels, left = [lbl for lbl, _ in steps], [0.0] * len(steps)
    for name, color in PART_COLORS.items():
        widths = [parts.get(name, 0.0) for _, parts in steps]
        shown = name if split or name != "compute" else "fwd+bwd (sync included)"
        if any(widths):  # absent parts stay out of the legend
            ax.barh(labels, widths, left=left, color=color, label=shown)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.invert_yaxis()
    ax.set(xlabel="ms per optimizer step (median)")
    fig.legend(loc="outside lower center", ncols=len(PART_COLORS), fontsize="small")
    note = (
        ""
        if split
        else missing(
            "compute_s/exposed_comm_s were not measured: compute is fwd_bwd_s, gradient sync "
            "included."
        )
    )
    if scopes:  # the figure under FSDP is a lower bound: say so beside it
        note += missing(f"What exposed comm measures: {scopes}.")
    rows = [[lbl, *(fmt(p.get(k), ".2f") for k in PART_COLORS)] for lbl, p in steps]
    return (
        png(fig, "step time parts")
        + note
        + html_table(["", *(f"{k} ms" for k in PART_COLORS)], rows)
    )


def section_bandwidth(record: RunRecord) -> str:
    """What the interconnect gave per message size (nccl-tests' busbw), against the link."""
    if not record.probe:
        return missing(f"{PROBE_CSV} is missing: run python -m orchestrator.probe to measure it.")
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in record.probe:
        size, bw = num(r.get("size_bytes")), num(r.get("busbw_gbps"))
        if size and bw:
            series[r.get("op", "?")].append((size, bw))
    fig, ax = figure()
    for op, points in sorted(series.items()):
        ax.plot(*zip(*sorted(points), strict=True), "o-", ms=3, label=op)
    link = findings.link_bound(record)
    if link is not None:
        ax.axhline(
            link.bandwidth_bytes_per_s / 1e9,
            ls="--",
            color="#555555",
            label=f"{link.name} (nominal)",
        )
    ax.set(xscale="log", yscale="log", xlabel="message size (bytes)", ylabel="bus bandwidth (GB/s)")
    ax.legend(fontsize="small")
    large = findings.probe_busbw_gbps(record)
    world = {r.get("world_size") for r in record.probe}
    text = (
        f"All-reduce bus bandwidth at large messages: {large[0]:.3g} GB/s "
        f"(backend {record.backend or '?'}, world size {', '.join(sorted(map(str, world)))})."
        if large
        else f"No all-reduce rows in {PROBE_CSV}."
    )
    if link is None:
        text += " No nominal link bound on this backend (gloo/CPU), so none is drawn."
    return f"<p>{esc(text)}</p>" + png(fig, "bus bandwidth against message size")


def section_gradients(record: RunRecord) -> str:
    """Per-layer gradient norms over the training run: vanishing or exploding layers show as
    lines drifting apart, and the last histogram shows the spread across layers."""
    path = record.files.get(GRAD_NORMS_CSV)
    if path is None:
        return missing(
            f"No training run folder with {GRAD_NORMS_CSV} (--train DIR2 or DIR/{TRAIN_DIR})."
        )
    per_layer: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in read_csv(path):
        step, norm = num(r.get("step")), num(r.get("norm"))
        if step is not None and norm is not None:
            per_layer[r.get("layer", "?")].append((step, norm))
    if not per_layer:  # a short or early-ended run: its totals and restarts still show
        return _summary_line(record) + missing(
            f"{GRAD_NORMS_CSV} holds no (step, layer, norm) rows."
        )
    last = max(s for points in per_layer.values() for s, _ in points)
    final = [n for points in per_layer.values() for s, n in points if s == last]
    fig = Figure(figsize=(10.0, 3.6), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    lines, hist = fig.subplots(1, 2, width_ratios=(2, 1))
    shade = colormaps["viridis"]  # by depth: a vanishing or exploding end shows as one colour
    for i, (layer, points) in enumerate(per_layer.items()):
        color = shade(i / max(1, len(per_layer) - 1))
        lines.plot(*zip(*sorted(points), strict=True), lw=1, label=layer, color=color)
    positive = all(n > 0 for points in per_layer.values() for _, n in points)
    lines.set(xlabel="step", ylabel="gradient norm", yscale="log" if positive else "linear")
    lines.xaxis.set_major_locator(MaxNLocator(integer=True))
    if len(per_layer) <= 10:
        lines.legend(fontsize="x-small")
    bins = min(30, max(5, len(final)))
    wide = min(final) > 0 and max(final) > 10 * min(final)  # norms spanning decades: log bins
    hist.hist(final, bins=np.geomspace(min(final), max(final), bins + 1) if wide else bins)
    hist.set(
        xlabel=f"gradient norm at step {last:g}",
        ylabel="layers",
        xscale="log" if wide else "linear",
    )
    order = "" if len(per_layer) <= 10 else "<p>Colour: first layer dark, last layer yellow.</p>"
    return _summary_line(record) + png(fig, "per-layer gradient norms") + order


def _summary_line(record: RunRecord) -> str:
    """The training run's totals (``Summary``: a figure of the wrong kind is absent), and each
    restart's line: what it resumed from, the steps re-done, where its seconds went."""
    summary = record.summary
    figures = (("steps", summary.steps), ("final_loss", summary.final_loss),
               ("samples_per_s", summary.samples_per_s),
               ("nonfinite_steps", summary.nonfinite_steps),
               ("nonfinite_rate", summary.nonfinite_rate))  # fmt: skip
    shown = [f"{label} {fmt(value)}" for label, value in figures if value is not None]
    if summary.loss_scale is not None:
        shown.append(f"loss scale {summary.loss_scale:g}")
    if summary.restarts is not None:
        shown.append(f"{len(summary.restarts)} restart(s)")
    restarts = [r["line"] for r in summary.restarts or []
                if isinstance(r, dict) and isinstance(r.get("line"), str)]  # fmt: skip
    listed = "".join(f"<li>{esc(line)}</li>" for line in restarts)
    text = f"<p>{esc('Training run: ' + ', '.join(shown))}.</p>" if shown else ""
    return text + (f"<ul>{listed}</ul>" if listed else "")


def section_findings(record: RunRecord) -> str:
    """The doctor's findings, the same text as ``python -m orchestrator.doctor`` prints."""
    found = findings.diagnose(record)
    items = "".join(
        f'<li><b class="{f.severity}">[{f.severity}] {esc(f.title)}</b><br>'
        f"evidence: {esc(f.evidence)}<br>fix: {esc(f.fix)}</li>"
        for f in found
    )
    body = f"<ol>{items}</ol>" if found else f"<p>{esc(findings.finding_lines([])[0])}</p>"
    return f"<pre>{esc(chr(10).join(findings.context_lines(record)))}</pre>{body}"
