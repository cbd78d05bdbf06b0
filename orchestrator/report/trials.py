"""Report sections about the trials: throughput, best vs baseline, importance, memory."""

from __future__ import annotations

import math
import statistics
import warnings

from matplotlib.ticker import MaxNLocator

from orchestrator.report.html import (
    FAILED_STATES,
    REPEAT_STATE,
    bar_chart,
    esc,
    figure,
    fmt,
    html_table,
    missing,
    png,
)
from orchestrator.runfiles import (
    BEST_YAML,
    REMEASURE_CSV,
    STUDY_DB,
    STUDY_JOURNAL,
    TRIALS_CSV,
    RunRecord,
    num,
)
from orchestrator.verdict.decide import verdict_from_rows
from orchestrator.verdict.paired import FUTILITY_CONFIDENCE


def section_throughput(record: RunRecord) -> str:
    """Every trial in order with the best-so-far line: where the search found its gains."""
    if not record.trials:
        return missing(f"{TRIALS_CSV} is missing: no trials to show.")
    rows = sorted(record.trials, key=lambda r: num(r.get("number")) or 0)
    fig, ax = figure()
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
    listed = [
        [r["number"], r.get("state", ""), fmt(num(r.get("samples_per_s"))),
         fmt(num(r.get("throughput_cv")), ".1%"), r.get("placement") or "",
         (r.get("reason") or "")[:160]]
        for r in rows
    ]  # fmt: skip
    return png(fig, "throughput per trial") + html_table(
        ["trial", "state", "samples/s", "cv", "placement (ranks per node)", "reason"], listed
    )


def _kind(state: str | None) -> str:
    if state == "pruned":
        return "pruned"
    if state == REPEAT_STATE:  # never run: no marker (the table below gives its reason)
        return "not run"
    return "failed" if state in FAILED_STATES else "complete"


def section_best_vs_baseline(record: RunRecord) -> str:
    """The claim the search makes, with its noise: from the verdict's measurement beside the
    baseline when there is one (remeasure.csv), else from the search's own windows."""
    if record.remeasure:
        return _from_remeasure(record)
    if not record.trials:
        return missing(f"{TRIALS_CSV} (and {REMEASURE_CSV}) is missing: no comparison.")
    base, best = record.baseline(), record.best()
    if base is None or best is None:
        return missing("The baseline (trial 0) did not complete: no comparison.")
    pair = [("baseline (trial 0)", base), (f"best (trial {best['number']})", best)]
    if best is base:
        pair = pair[:1]
    values = [
        (label, num(r["samples_per_s"]), num(r.get("throughput_cv")) or 0.0) for label, r in pair
    ]
    ratio = values[-1][1] / values[0][1]
    spread = ratio * (values[0][2] ** 2 + values[-1][2] ** 2) ** 0.5
    text = (
        "The best configuration is the baseline itself: no tried configuration beat it."
        if best is base
        else f"best / baseline = {ratio:.2f}x (spread +/-{spread:.2f}, from each trial's window "
        "cv; not re-measured side by side, so drift between trials is not accounted for)."
    )
    if best.get("lossy"):
        text += f" The best runs lossy knobs ({best['lossy']}): its gradients differ from the "
        text += "baseline's within their declared tolerance."
    return f"<p>{esc(text)}</p>" + bar_chart([(lbl, v, v * cv) for lbl, v, cv in values])


def _from_remeasure(record: RunRecord) -> str:
    """The search's own verdict (``orchestrator.verdict.decide``) from remeasure.csv: how it paired,
    each finalist's ratio with its interval against 1 + δ, the disturbed runs left out."""
    verdict = verdict_from_rows(record.remeasure)
    comps = verdict.comparisons
    if not comps:
        return missing(
            f"{REMEASURE_CSV} holds no finalist measured beside a completed baseline: "
            f"{verdict.line()}"
        )
    listed = "".join(f"<li>{esc(c.line())}</li>" for c in comps)
    again = "".join(f"<li>disturbed: {esc(w)}</li>" for w in verdict.disturbed)
    base = statistics.fmean(c.baseline_samples_per_s for c in comps)
    shown = [("baseline", base, 0.0)] + [
        (f"trial {c.number}", base * c.ratio, _finite(base * (c.high - c.low) / 2)) for c in comps
    ]
    return (
        f"<p><b>Verdict</b>: {esc(verdict.line())}</p>"
        f"<p>Measured beside the baseline ({esc(verdict.pairing)}); noise threshold δ "
        f"{verdict.delta * 100:g}%: a finalist is kept when its whole 95% interval lies above "
        f"{1 + verdict.delta:.2f}, and has no gain worth having when its one-sided "
        f"{FUTILITY_CONFIDENCE:.0%} upper bound lies below it. Each finalist's ratio and "
        "interval:</p>"
        f"<ul>{listed}{again}</ul>" + bar_chart(shown)
    )


def _finite(value: float) -> float:
    """An error bar matplotlib can draw (an interval of one pair is infinite: none drawn)."""
    return value if math.isfinite(value) else 0.0


def section_importance(record: RunRecord) -> str:
    """Which knobs mattered, per Optuna's importance evaluator over the stored study."""
    path = record.files.get(STUDY_DB) or record.files.get(STUDY_JOURNAL)
    if path is None:
        return missing(f"{STUDY_DB} is missing: importance needs the Optuna study.")
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    from orchestrator.config.study_storage import open_file

    storage = open_file(path)
    names = optuna.get_all_study_names(storage)
    name = record.name if record.name in names else (names[0] if len(names) == 1 else None)
    if name is None:
        held = f"{path.name} holds studies {names}"
        return missing(f"{held}, none named {record.name!r} ({BEST_YAML}).")
    study = optuna.load_study(study_name=name, storage=storage)
    why = _importance_blocker(study)
    if why:
        return missing(f"Importance cannot be computed: {why}.")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scores = optuna.importance.get_param_importances(study)
    fig, ax = figure(6.0, 0.6 + 0.35 * len(scores))
    ax.barh(list(scores), list(scores.values()), color="#1f77b4")
    ax.invert_yaxis()
    ax.set(xlabel="importance for samples/s (normalised to sum to 1)")
    notes = "".join(f"<p class='missing'>Optuna: {esc(str(w.message))}</p>" for w in caught)
    text = f"Over {len(study.trials)} trials of study {name!r}, Optuna's default evaluator."
    return f"<p>{esc(text)}</p>" + png(fig, "parameter importance") + notes


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


def section_memory(record: RunRecord) -> str:
    """Peak memory per trial: how close each configuration came to the capacity (OOMs marked)."""
    if not record.trials:
        return missing(f"{TRIALS_CSV} is missing: no peak memory to show.")
    rows = [(r, num(r.get("peak_mem_mib"))) for r in record.trials]
    shown = [(r, mib) for r, mib in rows if mib is not None]
    if not shown:
        return missing("No trial recorded its peak memory (peak_mem_mib is empty).")
    fig, ax = figure()
    colors = {"complete": "#1f77b4", "pruned": "#888888", "failed": "#d62728"}
    ax.bar([f"{r['number']}" for r, _ in shown], [mib / 1024 for _, mib in shown],
           color=[colors[_kind(r.get("state"))] for r, _ in shown])  # fmt: skip
    capacity = record.run_info.memory_capacity_bytes
    if capacity:
        ax.axhline(capacity / 2**30, ls="--", color="#d62728", label="capacity")
        ax.legend(fontsize="small")
    ax.set(xlabel="trial", ylabel="peak memory (GiB)")
    ooms = [r["number"] for r, _ in rows if r.get("state") == "oom"]
    text = f"Out of memory: trial(s) {', '.join(ooms)}." if ooms else "No trial ran out of memory."
    how = (
        "Per worker: on GPUs the larger of CUDA max allocated and the GPU's used memory "
        "(NCCL buffers included), peak RSS on CPUs."
    )
    return f"<p>{esc(text)} {how}</p>" + png(fig, "peak memory per trial")
