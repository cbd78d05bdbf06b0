"""The finalists, re-measured interleaved with the baseline (B c1 B c2 B ...).

A search compares trials measured minutes apart on a machine whose speed drifts; the top
configurations are measured again right beside baseline runs, written to remeasure.csv and
judged by ``orchestrator.verdict``.
"""

from __future__ import annotations

import csv
from pathlib import Path

from orchestrator.search.results import TrialRecord
from orchestrator.search.trial import TrialContext, derive_plan, measure_plans
from orchestrator.verdict import Comparison, Run, comparisons
from train_fns import metrics as m


def interleave(baseline: TrialRecord, finalists: list[TrialRecord]) -> list[TrialRecord]:
    """B c1 B c2 ... B: every finalist sits between two baseline runs."""
    order = [baseline]
    for rec in finalists:
        order += [rec, baseline]
    return order


def finalists(recs: list[TrialRecord], baseline: TrialRecord, top: int) -> list[TrialRecord]:
    """The ``top`` fastest completed configs other than the baseline, one per config."""
    seen, out = [baseline.params], []
    for rec in sorted((r for r in recs if r.value is not None), key=lambda r: -r.value):
        if rec.params not in seen and len(out) < top:
            seen.append(rec.params)
            out.append(rec)
    return out


def remeasure(
    ctx: TrialContext, baseline: TrialRecord, chosen: list[TrialRecord], out: Path
) -> list[Comparison]:
    """Run the interleaved sequence for real (runs with the same environment variables share a
    worker group, as in the search); returns comparisons, best first."""
    order = interleave(baseline, chosen)

    def show(i: int, outcome: dict) -> None:
        shown = (
            f"{outcome[m.SAMPLES_PER_S]:.2f} samples/s (cv {outcome[m.THROUGHPUT_CV]:.1%})"
            if outcome[m.STATE] == m.COMPLETE
            else f"{outcome[m.STATE]}: {outcome[m.REASON]}"
        )
        who = "baseline" if order[i] is baseline else f"trial {order[i].number}"
        print(f"re-measure {i + 1}/{len(order)}: {who}: {shown}", flush=True)

    plans = [derive_plan(ctx, rec.params) for rec in order]
    results = measure_plans(ctx, plans, "remeasure", show)
    _write_csv(order, results, baseline, out / "remeasure.csv")
    return comparisons(_runs(order, results, baseline))


def _runs(order: list[TrialRecord], results: list[dict], baseline: TrialRecord) -> list[Run]:
    return [
        Run(
            rec.number,
            rec is baseline,
            res[m.SAMPLES_PER_S] if res.get(m.STATE) == m.COMPLETE else None,
            res.get(m.THROUGHPUT_CV) or 0.0,
        )
        for rec, res in zip(order, results, strict=True)
    ]


def _write_csv(
    order: list[TrialRecord], results: list[dict], baseline: TrialRecord, path: Path
) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["position", "trial", "role", "state", "samples_per_s", "throughput_cv"])
        for i, (rec, res) in enumerate(zip(order, results, strict=True)):
            w.writerow(
                [
                    i,
                    rec.number,
                    "baseline" if rec is baseline else "finalist",
                    res.get(m.STATE),
                    res.get(m.SAMPLES_PER_S) or "",
                    res.get(m.THROUGHPUT_CV) or "",
                ]
            )
