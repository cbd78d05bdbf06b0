"""The finalists, re-measured interleaved with the baseline (B c1 B c2 B ...).

A search compares trials measured minutes apart on a machine whose speed drifts; the top
configurations are measured again right beside baseline runs, a disturbed run once more (a
bounded number of times), written to remeasure.csv and judged by ``orchestrator.verdict``.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.runfiles import REMEASURE_CSV, write_csv
from orchestrator.search.results import TrialRecord
from orchestrator.search.trial import TrialContext, derive_plan, measure_plans
from orchestrator.verdict import Measure, Run, Verdict, disturbances, judge
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
) -> Verdict:
    """Run the interleaved sequence for real (runs with the same environment variables share a
    worker group, as in the search), then measure each disturbed run again, up to
    ``search.remeasure_repeats`` times, in the sequence's order; returns the verdict."""
    order = interleave(baseline, chosen)
    plans = [derive_plan(ctx, rec.params) for rec in order]
    results: list[list[dict]] = [[res] for res in measure_plans(
        ctx, plans, "remeasure", lambda i, res: _show(order, baseline, i, res, 0)
    )]  # fmt: skip
    windows = ctx.config.search.windows
    for repeat in range(1, ctx.config.search.remeasure_repeats + 1):
        why = disturbances(_runs(order, results, baseline))
        again = [i for i, ws in enumerate(why) if ws[-1]]
        for i in again:
            print(f"re-measure {i + 1}/{len(order)}: {_who(order, baseline, i)} was disturbed "
                  f"({why[i][-1]}): measuring it again (repeat {repeat})", flush=True)  # fmt: skip
        if not again:
            break
        redo = measure_plans(
            ctx, [plans[i] for i in again], f"repeat{repeat}",
            lambda k, res, r=repeat, again=again: _show(order, baseline, again[k], res, r),
        )  # fmt: skip
        for i, res in zip(again, redo, strict=True):
            results[i].append(res)
    runs = _runs(order, results, baseline)
    _write_csv(order, results, baseline, disturbances(runs), windows, out / REMEASURE_CSV)
    return judge(runs, windows)


def _who(order: list[TrialRecord], baseline: TrialRecord, i: int) -> str:
    return "baseline" if order[i] is baseline else f"trial {order[i].number}"


def _show(order: list[TrialRecord], baseline: TrialRecord, i: int, res: dict, repeat: int) -> None:
    shown = (
        f"{res[m.SAMPLES_PER_S]:.2f} samples/s (cv {res[m.THROUGHPUT_CV]:.1%})"
        if res[m.STATE] == m.COMPLETE
        else f"{res[m.STATE]}: {res[m.REASON]}"
    )
    again = f" (repeat {repeat})" if repeat else ""
    who = _who(order, baseline, i)
    if res.get(m.PLACEMENT):
        shown += f" on {res[m.PLACEMENT]}"
    print(f"re-measure {i + 1}/{len(order)}{again}: {who}: {shown}", flush=True)


def _measure(res: dict, placement: str | None) -> Measure:
    """A measurement as the verdict sees it: one whose ranks sat otherwise than the first
    baseline run's (``placement``) does not compare, and counts as not completed."""
    misplaced = placement and res.get(m.PLACEMENT, placement) != placement
    done = res.get(m.STATE) == m.COMPLETE and not misplaced
    return Measure(res[m.SAMPLES_PER_S] if done else None, res.get(m.THROUGHPUT_CV) or 0.0)


def _runs(order: list[TrialRecord], results: list[list[dict]], baseline: TrialRecord) -> list[Run]:
    runs, placement = [], results[0][0].get(m.PLACEMENT)
    for rec, found in zip(order, results, strict=True):
        first = _measure(found[0], placement)
        repeats = tuple(_measure(res, placement) for res in found[1:])
        runs.append(Run(rec.number, rec is baseline, first.samples_per_s, first.cv, repeats))
    return runs


def _write_csv(
    order: list[TrialRecord],
    results: list[list[dict]],
    baseline: TrialRecord,
    why: list[list[str]],
    windows: int,
    path: Path,
) -> None:
    """One row per measurement: a repeat shares its run's position; ``disturbed`` says why a
    measurement was left out of the verdict. Written whole (``runfiles.write_csv``): a reader
    such as the report never sees half the verdict's evidence."""
    header = ["position", "repeat", "trial", "role", "state", "samples_per_s", "throughput_cv",
              "windows", "disturbed", m.PLACEMENT]  # fmt: skip
    rows = [
        [
            i, k, rec.number, "baseline" if rec is baseline else "finalist",
            res.get(m.STATE), res.get(m.SAMPLES_PER_S) or "",
            res.get(m.THROUGHPUT_CV) or "", windows, why[i][k], res.get(m.PLACEMENT, ""),
        ]
        for i, rec in enumerate(order)
        for k, res in enumerate(results[i])
    ]  # fmt: skip
    write_csv(path, header, rows)
