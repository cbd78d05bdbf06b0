"""``python -m orchestrator.report DIR [--train DIR2] [--out FILE]``: explain a run in one page.

Writes ``DIR/report.html`` (or FILE): one self-contained HTML file that opens offline (figures
are matplotlib PNGs drawn with Agg and embedded as base64 data URIs; no script, stylesheet or
link leaves the file), so it can be mailed or attached to a ticket as is. Sections: every
trial's throughput, best vs baseline with its spread, parameter importance, step-time parts,
bus bandwidth against message size, peak memory, gradient health (with a training run folder:
``--train DIR2`` or ``DIR/train``) and the doctor's findings. A section whose file is missing
says so in one line instead of failing the page.

Exit codes: 0 written, 2 DIR holds none of the run files (one line naming it).
"""

from __future__ import annotations

import argparse
import base64
import datetime
import html
import io
import logging
import math
import statistics
import sys
import warnings
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from orchestrator import doctor
from orchestrator.doctor import RunRecord, num

SECTIONS = (
    ("throughput", "Throughput of every trial"),
    ("best-vs-baseline", "Best vs baseline"),
    ("importance", "Parameter importance"),
    ("step-time", "Where a step's time goes"),
    ("bandwidth", "Bus bandwidth against message size"),
    ("memory", "Peak memory per configuration"),
    ("gradients", "Gradient health"),
    ("findings", "Findings of the doctor"),
)
FAILED_STATES = ("oom", "hang", "crash", "infeasible", "interrupted", "error")
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


def _missing(text: str) -> str:
    return f'<p class="missing">{esc(text)}</p>'


def _figure(width: float = 8.0, height: float = 3.4) -> tuple[Figure, Axes]:
    """A Figure on an explicit Agg canvas: no pyplot global state, no display needed."""
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots()


def _png(fig: Figure, alt: str) -> str:
    """The figure as an inline data URI, so the page needs nothing beside it."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img alt="{esc(alt)}" src="data:image/png;base64,{data}">'


def _table(header: list[str], rows: list[list[object]]) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _fmt(value: float | None, spec: str = ".4g") -> str:
    return "" if value is None else format(value, spec)


def section_throughput(record: RunRecord) -> str:
    """Every trial in order with the best-so-far line: where the search found its gains."""
    if not record.trials:
        return _missing("trials.csv is missing: no trials to show.")
    rows = sorted(record.trials, key=lambda r: num(r.get("number")) or 0)
    fig, ax = _figure()
    best_so_far, best = [], math.nan  # NaN draws nothing until the first complete trial
    for r in rows:
        value = num(r.get("samples_per_s")) if r.get("state") == "complete" else None
        if value is not None:
            best = value if math.isnan(best) else max(best, value)
        best_so_far.append(best)
    xs = [int(num(r["number"]) or 0) for r in rows]
    done = [
        (x, num(r["samples_per_s"]))
        for x, r in zip(xs, rows, strict=True)
        if r in record.completed()
    ]
    if done:
        ax.plot(*zip(*done, strict=True), "o", color="#1f77b4", label="complete")
    ax.step(xs, best_so_far, where="post", color="#2ca02c", label="best so far")
    for state, marker, color in (("pruned", "v", "#888888"), ("failed", "x", "#d62728")):
        hit = [x for x, r in zip(xs, rows, strict=True) if _kind(r.get("state")) == state]
        if hit:
            ax.plot(
                hit, [0] * len(hit), marker, color=color, ms=9, ls="", label=state, clip_on=False
            )
    ax.set(xlabel="trial", ylabel="global samples/s", ylim=(0, None))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.legend(loc="outside lower center", ncols=4, fontsize="small")
    table = [
        [r["number"], r.get("state", ""), _fmt(num(r.get("samples_per_s"))),
         _fmt(num(r.get("throughput_cv")), ".1%"), (r.get("reason") or "")[:160]]
        for r in rows
    ]  # fmt: skip
    return _png(fig, "throughput per trial") + _table(
        ["trial", "state", "samples/s", "cv", "reason"], table
    )


def _kind(state: str | None) -> str:
    if state == "pruned":
        return "pruned"
    return "failed" if state in FAILED_STATES else "complete"


def section_best_vs_baseline(record: RunRecord) -> str:
    """The claim the search makes, with its noise: from the interleaved re-measurement when
    there is one (B c1 B c2 B), else from the search's own windows."""
    if record.remeasure:
        return _from_remeasure(record)
    if not record.trials:
        return _missing("trials.csv (and remeasure.csv) is missing: no comparison.")
    base, best = record.baseline(), record.best()
    if base is None or best is None:
        return _missing("The baseline (trial 0) did not complete: no comparison.")
    bars = [("baseline (trial 0)", base), (f"best (trial {best['number']})", best)]
    if best is base:
        bars = bars[:1]
    values = [
        (label, num(r["samples_per_s"]), num(r.get("throughput_cv")) or 0.0) for label, r in bars
    ]
    ratio = values[-1][1] / values[0][1]
    spread = ratio * (values[0][2] ** 2 + values[-1][2] ** 2) ** 0.5
    text = (
        "The best configuration is the baseline itself: no tried configuration beat it."
        if best is base
        else f"best / baseline = {ratio:.2f}x (spread +/-{spread:.2f}, from each trial's window "
        "cv; not re-measured side by side, so drift between trials is not accounted for)."
    )
    return f"<p>{esc(text)}</p>" + _bars([(lbl, v, v * cv) for lbl, v, cv in values])


def _from_remeasure(record: RunRecord) -> str:
    from orchestrator.remeasure import compare  # the search's own verdict, not a copy of it

    rows = sorted(record.remeasure, key=lambda r: num(r.get("position")) or 0)
    tps = [num(r.get("samples_per_s")) if r.get("state") == "complete" else None for r in rows]
    baselines = [t for r, t in zip(rows, tps, strict=True) if r.get("role") == "baseline" and t]
    if not baselines:
        return _missing("remeasure.csv holds no completed baseline run: no comparison.")
    lines, bars = [], [("baseline", statistics.fmean(baselines), _sd(baselines))]
    for i, (r, tp) in enumerate(zip(rows, tps, strict=True)):
        near = [tps[j] for j in (i - 1, i + 1) if 0 <= j < len(rows) and tps[j]]
        if r.get("role") != "finalist" or not tp or not near:
            continue
        cv = num(r.get("throughput_cv")) or 0.0
        comp = compare(int(num(r["trial"]) or 0), tp, cv, near, baselines)
        lines.append(comp.line())
        bars.append((f"trial {comp.number}", tp, tp * cv))
    listed = "".join(f"<li>{esc(line)}</li>" for line in lines) or "<li>no finalist completed</li>"
    return (
        f"<p>Re-measured side by side ({len(baselines)} baseline runs):</p><ul>{listed}</ul>"
        + _bars(bars)
    )


def _sd(values: list[float]) -> float:
    return statistics.pstdev(values) if len(values) > 1 else 0.0


def _bars(bars: list[tuple[str, float, float]]) -> str:
    fig, ax = _figure(6.0, 0.6 + 0.5 * len(bars))
    labels, values, errs = zip(*bars, strict=True)
    ax.barh(labels, values, xerr=errs, color=["#888888", *["#1f77b4"] * (len(bars) - 1)], capsize=4)
    ax.invert_yaxis()
    ax.set(xlabel="global samples/s (error bar: spread)")
    return _png(fig, "best vs baseline")


def section_importance(record: RunRecord) -> str:
    """Which knobs mattered, per Optuna's importance evaluator over the stored study."""
    path = record.files.get("study.db") or record.files.get("study.journal")
    if path is None:
        return _missing("study.db is missing: importance needs the Optuna study.")
    import optuna

    from orchestrator.storage import open_file

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = open_file(path)
    names = optuna.get_all_study_names(storage)
    name = record.name if record.name in names else (names[0] if len(names) == 1 else None)
    if name is None:
        held = f"{path.name} holds studies {names}"
        return _missing(f"{held}, none named {record.name!r} (best.yaml).")
    study = optuna.load_study(study_name=name, storage=storage)
    why = _importance_blocker(study)
    if why:
        return _missing(f"Importance cannot be computed: {why}.")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scores = optuna.importance.get_param_importances(study)
    fig, ax = _figure(6.0, 0.6 + 0.35 * len(scores))
    ax.barh(list(scores), list(scores.values()), color="#1f77b4")
    ax.invert_yaxis()
    ax.set(xlabel="importance for samples/s (normalised to sum to 1)")
    notes = "".join(f"<p class='missing'>Optuna: {esc(str(w.message))}</p>" for w in caught)
    text = f"Over {len(study.trials)} trials of study {name!r}, Optuna's default evaluator."
    return f"<p>{esc(text)}</p>" + _png(fig, "parameter importance") + notes


def _importance_blocker(study: object) -> str | None:
    """Why Optuna would refuse or return noise: it needs two complete trials that differ in a
    parameter every complete trial has (a conditional FSDP knob alone does not count)."""
    from optuna.trial import TrialState

    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(done) < 2:
        return f"{len(done)} complete trial(s); at least 2 are needed"
    shared = set.intersection(*(set(t.params) for t in done))
    if not any(len({repr(t.params[p]) for t in done}) > 1 for p in shared):
        return "no parameter shared by the complete trials takes more than one value"
    return None


def _parts(step: doctor.StepParts) -> dict[str, float]:
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
            doctor.trial_step(base, "baseline (trial 0)" + (" = best" if best is base else ""))
        )
    if best is not None and best is not base:
        steps.append(doctor.trial_step(best, f"best (trial {best['number']})"))
    trained = doctor.training_step(record)
    if trained is not None and trained.step_time_s is not None:
        steps.append(trained)
    steps = [(s.label, _parts(s)) for s in steps]
    steps = [(label, parts) for label, parts in steps if parts]
    if not steps:
        return _missing("No completed trial with step-time parts (trials.csv missing or empty).")
    fig, ax = _figure(8.0, 0.9 + 0.55 * len(steps))
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
        else _missing(
            "compute_s/exposed_comm_s were not measured: compute is fwd_bwd_s, gradient sync "
            "included."
        )
    )
    rows = [[lbl, *(_fmt(p.get(k), ".2f") for k in PART_COLORS)] for lbl, p in steps]
    return (
        _png(fig, "step time parts") + note + _table(["", *(f"{k} ms" for k in PART_COLORS)], rows)
    )


def section_bandwidth(record: RunRecord) -> str:
    """What the interconnect gave per message size (nccl-tests' busbw), against the link."""
    if not record.probe:
        return _missing("probe.csv is missing: run python -m orchestrator.probe to measure it.")
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in record.probe:
        size, bw = num(r.get("size_bytes")), num(r.get("busbw_gbps"))
        if size and bw:
            series[r.get("op", "?")].append((size, bw))
    fig, ax = _figure()
    for op, points in sorted(series.items()):
        ax.plot(*zip(*sorted(points), strict=True), "o-", ms=3, label=op)
    link = doctor.link_bound(record)
    if link is not None:
        ax.axhline(
            link.bandwidth_bytes_per_s / 1e9,
            ls="--",
            color="#555555",
            label=f"{link.name} (nominal)",
        )
    ax.set(xscale="log", yscale="log", xlabel="message size (bytes)", ylabel="bus bandwidth (GB/s)")
    ax.legend(fontsize="small")
    large = doctor.probe_busbw_gbps(record)
    world = {r.get("world_size") for r in record.probe}
    text = (
        f"All-reduce bus bandwidth at large messages: {large[0]:.3g} GB/s "
        f"(backend {record.backend or '?'}, world size {', '.join(sorted(map(str, world)))})."
        if large
        else "No all-reduce rows in probe.csv."
    )
    if link is None:
        text += " No nominal link bound on this backend (gloo/CPU), so none is drawn."
    return f"<p>{esc(text)}</p>" + _png(fig, "bus bandwidth against message size")


def section_memory(record: RunRecord) -> str:
    """Peak memory per trial: how close each configuration came to the capacity (OOMs marked)."""
    if not record.trials:
        return _missing("trials.csv is missing: no peak memory to show.")
    rows = [(r, num(r.get("peak_mem_mib"))) for r in record.trials]
    shown = [(r, mib) for r, mib in rows if mib is not None]
    if not shown:
        return _missing("No trial recorded its peak memory (peak_mem_mib is empty).")
    fig, ax = _figure()
    colors = {"complete": "#1f77b4", "pruned": "#888888", "failed": "#d62728"}
    ax.bar([f"{r['number']}" for r, _ in shown], [mib / 1024 for _, mib in shown],
           color=[colors[_kind(r.get("state"))] for r, _ in shown])  # fmt: skip
    capacity = num(record.run_info.get("memory_capacity_bytes"))
    if capacity:
        ax.axhline(capacity / 2**30, ls="--", color="#d62728", label="capacity")
        ax.legend(fontsize="small")
    ax.set(xlabel="trial", ylabel="peak memory (GiB)")
    ooms = [r["number"] for r, _ in rows if r.get("state") == "oom"]
    text = f"Out of memory: trial(s) {', '.join(ooms)}." if ooms else "No trial ran out of memory."
    return f"<p>{esc(text)} Per worker: CUDA max allocated on GPUs, peak RSS on CPUs.</p>" + _png(
        fig, "peak memory per trial"
    )


def section_gradients(record: RunRecord) -> str:
    """Per-layer gradient norms over the training run: vanishing or exploding layers show as
    lines drifting apart, and the last histogram shows the spread across layers."""
    path = record.files.get("grad_norms.csv")
    if path is None:
        return _missing("No training run folder with grad_norms.csv (--train DIR2 or DIR/train).")
    per_layer: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in doctor.read_csv(path):
        step, norm = num(r.get("step")), num(r.get("norm"))
        if step is not None and norm is not None:
            per_layer[r.get("layer", "?")].append((step, norm))
    if not per_layer:
        return _missing("grad_norms.csv holds no (step, layer, norm) rows.")
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
    return _summary_line(record) + _png(fig, "per-layer gradient norms") + order


def _summary_line(record: RunRecord) -> str:
    keys = ("steps", "final_loss", "samples_per_s", "nonfinite_steps", "nonfinite_rate")
    shown = [
        f"{k} {_fmt(num(record.summary.get(k)))}" for k in keys if record.summary.get(k) is not None
    ]
    if record.summary.get("loss_scale") is not None:
        shown.append(f"loss scale {record.summary['loss_scale']}")
    if isinstance(record.summary.get("restarts"), list):
        shown.append(f"{len(record.summary['restarts'])} restart(s)")
    return f"<p>{esc('Training run: ' + ', '.join(shown))}.</p>" if shown else ""


def section_findings(record: RunRecord) -> str:
    """The doctor's findings, the same text as ``python -m orchestrator.doctor`` prints."""
    findings = doctor.diagnose(record)
    items = "".join(
        f'<li><b class="{f.severity}">[{f.severity}] {esc(f.title)}</b><br>'
        f"evidence: {esc(f.evidence)}<br>fix: {esc(f.fix)}</li>"
        for f in findings
    )
    body = f"<ol>{items}</ol>" if findings else f"<p>{esc(doctor.finding_lines([])[0])}</p>"
    return f"<pre>{esc(chr(10).join(doctor.context_lines(record)))}</pre>{body}"


BUILDERS: dict[str, Callable[[RunRecord], str]] = {
    "throughput": section_throughput,
    "best-vs-baseline": section_best_vs_baseline,
    "importance": section_importance,
    "step-time": section_step_time,
    "bandwidth": section_bandwidth,
    "memory": section_memory,
    "gradients": section_gradients,
    "findings": section_findings,
}


def render(record: RunRecord, folder: Path) -> str:
    """The whole page; one section failing to draw is a line in that section, not a lost page."""
    sections = []
    for sid, title in SECTIONS:
        try:
            body = BUILDERS[sid](record)
        except Exception as e:  # best effort per section: said on the page, traceback in the log
            log.warning("report: section %s could not be drawn", sid, exc_info=True)
            first = str(e).partition("\n")[0]
            body = _missing(f"This section could not be drawn: {type(e).__name__}: {first}")
        sections.append(f'<section>\n<h2 id="{sid}">{esc(title)}</h2>\n{body}\n</section>')
    name = record.name or folder.name
    return (
        f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>commtune report: {esc(name)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
        f"<h1>commtune report: {esc(name)}</h1>\n"
        f'<p class="meta">{esc(_header(record, folder))}</p>\n'
        + "\n".join(sections)
        + "\n</body>\n</html>\n"
    )


def _header(record: RunRecord, folder: Path) -> str:
    cfg = record.best_config
    workload = cfg.get("workload") or {}
    bits = [
        f"generated {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
        f"from {folder}",
        f"model {record.model or '?'}",
        f"{record.world_size or '?'} workers",
        f"backend {record.backend or '?'}",
    ]
    if workload.get("global_batch"):
        bits.append(f"global batch {workload['global_batch']}, seq_len {workload.get('seq_len')}")
    if "trials.csv" in record.files:
        written = datetime.datetime.fromtimestamp(record.files["trials.csv"].stat().st_mtime)
        bits.append(f"trials written {written:%Y-%m-%d %H:%M}")
    return "; ".join(bits)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m orchestrator.report", description=__doc__)
    p.add_argument("dir", type=Path, metavar="DIR", help="search output folder (runs/<name>)")
    p.add_argument("--train", type=Path, metavar="DIR2", help="training run folder")
    p.add_argument("--out", type=Path, metavar="FILE", help="default: DIR/report.html")
    args = p.parse_args(argv)
    bad = doctor.missing_dirs([args.dir] + ([args.train] if args.train else []))
    if bad:
        print(f"report: {bad[0]}", file=sys.stderr)
        return 2
    # the training folder first: its summary/grad norms win over a stale DIR/train
    record = doctor.collect(([args.train] if args.train else []) + [args.dir])
    out = args.out or args.dir / "report.html"
    out.write_text(render(record, args.dir))
    print(f"report: wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
