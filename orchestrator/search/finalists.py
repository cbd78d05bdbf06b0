"""The finalists, measured again beside the baseline, and the verdict.

A search compares trials measured minutes apart on a machine whose speed drifts. Every
configuration whose search figure is within the search's measured noise of the best is a
finalist (``finalists``, at most ``search.remeasure_top``). Those the baseline's worker group
can switch to (same environment variables) and hold at once (``fit_together``) race it in
paired windows (``search.race``); the others run as whole groups interleaved with baseline runs
(B c1 B c2 B ...), a disturbed run once more (a bounded number of times). Both write
remeasure.csv, and ``orchestrator.verdict.decide`` judges it.
"""

from __future__ import annotations

import time
from pathlib import Path

from orchestrator.cluster.placement import group_nodes, pinnable
from orchestrator.runfiles import REMEASURE_CSV, Board, add_race_time, read_csv
from orchestrator.runfiles.remeasure import (
    BASELINE,
    FINALIST,
    GROUP,
    WINDOW,
    Remeasured,
    read_rows,
    write_remeasure,
)
from orchestrator.search.lease import Lease
from orchestrator.search.race import Race
from orchestrator.search.results import TrialRecord
from orchestrator.search.trial import TrialContext, derive_plan, measure_plans
from orchestrator.verdict.decide import (
    MEASURE_ON_TIMES,
    UNDECIDED,
    Measure,
    Run,
    Verdict,
    disturbances,
    verdict_from_rows,
)
from orchestrator.verdict.paired import (
    comparable_cv,
    noise_floor,
    ratios_from_rows,
    recorded_fraction,
)
from train_fns import metrics as m


def interleave(baseline: TrialRecord, finalists: list[TrialRecord]) -> list[TrialRecord]:
    """B c1 B c2 ... B: every finalist sits between two baseline runs."""
    order = [baseline]
    for rec in finalists:
        order += [rec, baseline]
    return order


NOISE_MARGIN = 2.0
"""A finalist's search figure is within this many times the search's typical window cv of
the best (never less than 2 δ: one measurement each, minutes apart, cannot order them closer)."""
RESIDENT_BYTES_PER_PARAM = 16
"""What a built configuration holds between its windows, per parameter: fp32 weights and
gradients and AdamW's two moments (sharded over the ranks under FSDP)."""
MEMORY_SHARE = 0.9
"""Of a device's capacity, what the residents and their steps' working memory may use."""


def finalists(
    recs: list[TrialRecord], baseline: TrialRecord, top: int, margin: float | None = None
) -> list[TrialRecord]:
    """The fastest completed configs other than the baseline, one per config, at most ``top``;
    with ``margin``, only those within it (relative) of the fastest."""
    seen, out = [baseline.params], []
    ranked = sorted((r for r in recs if r.value is not None), key=lambda r: -r.value)
    best = next((r.value for r in ranked if r.params != baseline.params), None)
    if best is None:
        return []
    for rec in ranked:
        near = margin is None or rec.value >= best * (1 - margin)
        if rec.params not in seen and len(out) < top and near:
            seen.append(rec.params)
            out.append(rec)
    return out


def window_cvs(recs: list[TrialRecord]) -> list[float]:
    """The completed trials' window cvs (0 where a trial recorded none): what the finalists'
    margin and the race's noise floor are read from."""
    return [r.attrs.get(m.THROUGHPUT_CV) or 0.0 for r in recs if r.value is not None]


def noise_margin(recs: list[TrialRecord], delta: float, windows: int) -> float:
    """How close to the best a search figure must be to race: ``NOISE_MARGIN`` times the
    completed trials' median window cv (from ``windows`` windows a trial, as three would show
    it: ``paired.comparable_cv``), at least 2 δ."""
    cvs = sorted(window_cvs(recs))
    typical = comparable_cv(cvs[len(cvs) // 2], windows) if cvs else 0.0
    return max(NOISE_MARGIN * typical, 2 * delta)


def fit_together(recs: list[TrialRecord], world_size: int) -> bool:
    """Whether these configurations can all stay built in one worker group: what each holds
    between windows (``RESIDENT_BYTES_PER_PARAM``) plus every step's working memory (its peak
    beyond that) within ``MEMORY_SHARE`` of the device. The sum, not the largest: torch's
    caching allocator keeps each configuration's freed working blocks between windows, and one
    configuration's block sizes need not serve another's, so a race whose windows are to cost
    alike (no cudaFree and re-malloc in some switches only) needs room for all of them at
    once. Unknown figures: assumed to fit when no capacity is known, not to fit when a peak is
    missing."""
    known = [r.attrs.get(m.MEMORY_CAPACITY_BYTES) for r in recs]
    capacity = min((c for c in known if c), default=0)
    if not capacity:
        return True
    held, working = 0.0, 0.0
    for rec in recs:
        peak = rec.attrs.get(m.PEAK_MEM_BYTES)
        if not peak:
            return False
        shards = world_size if rec.params.get("strategy") == "fsdp" else 1
        resident = min(peak, (rec.attrs.get(m.NUM_PARAMS) or 0) * RESIDENT_BYTES_PER_PARAM / shards)
        held += resident
        working += peak - resident
    return held + working <= MEMORY_SHARE * capacity


def remeasure(
    ctx: TrialContext, baseline: TrialRecord, chosen: list[TrialRecord], out: Path,
    recs: list[TrialRecord], deadline: float | None = None, lent: Lease | None = None,
) -> Verdict:
    """Measure the finalists again beside the baseline, in paired windows where they can be
    (in ``lent``, the search's last group, when given), in interleaved worker groups where
    not; remeasure.csv, and the verdict read from it."""
    _, env = derive_plan(ctx, baseline.params)
    switchable = [rec for rec in chosen if derive_plan(ctx, rec.params)[1] == env]
    window = list(switchable)
    while window and not fit_together([baseline, *window], ctx.config.cluster.num_workers):
        window.pop()  # the slowest first
    rows: list[Remeasured] = []
    if window:
        floor = noise_floor(window_cvs(recs), ctx.config.search.windows)
        race = Race(ctx, baseline, window, deadline=deadline, floor=floor)
        race.board, race.lent = Board(out, "race"), lent
        try:
            race.run()
        finally:
            race.board.close()
            add_race_time(out, race.wall_s, race.measured_s)
        rows += race.rows
        if race.ended:
            print(f"race: ended early: {race.ended}", flush=True)
    grouped = [rec for rec in chosen if rec not in window]
    if lent is not None:
        lent.close()  # the cluster free for the groups below (once: the race may have ended it)
    if grouped:
        memory = "it would not fit in memory beside the others"
        shown = ", ".join(
            f"trial {r.number} ({memory if r in switchable else _env_change(ctx, env, r)})"
            for r in grouped
        )
        print(f"re-measuring in paired runs interleaved with the baseline: {shown}", flush=True)
        rows += _group_rows(ctx, baseline, grouped, start=len(rows))
    write_remeasure(out / REMEASURE_CSV, rows)
    return verdict_from_rows(rows, ctx.config.search.verdict_delta)


def measure_on(
    ctx: TrialContext, baseline: TrialRecord, recs: list[TrialRecord], out: Path,
    deadline: float | None = None,
) -> Verdict | None:
    """The verdict on record (remeasure.csv; None: there is none), and where it keeps nothing
    while a window-paired finalist is undecided, the race measured on from its pairs: a
    resumed search whose trials are all done spends its time where the answer is, not on a new
    search. Each pair's two windows come from one worker group, side by side, so drift between
    invocations cancels as drift between rounds does. The δ on record judges the new pairs too
    (a δ is chosen before the pairs are seen), and a race is measured on
    ``verdict.MEASURE_ON_TIMES`` times at most (remeasure.csv's ``race`` counts them)."""
    path = out / REMEASURE_CSV
    rows = read_rows(read_csv(path)) if path.is_file() else []
    if not rows:
        return None
    delta = recorded_fraction((r.delta for r in rows), ctx.config.search.verdict_delta)
    if delta != ctx.config.search.verdict_delta:
        print(f"resume: δ {delta * 100:g}% on record, {ctx.config.search.verdict_delta * 100:g}%"
              " configured: the verdict stays at the δ its pairs were taken for (a new δ takes "
              "a new search)", flush=True)  # fmt: skip
    verdict = verdict_from_rows(rows, delta)
    found = ratios_from_rows(rows)
    raced = sorted({int(k) for k in found} | _warmed_up(rows))
    open_ = [n for n in raced if all(c.number != n or c.decision == UNDECIDED
                                     for c in verdict.comparisons)]  # fmt: skip
    why = _stands(verdict, open_, deadline)
    if why:
        print(f"resume: the verdict on record stands ({why}): {verdict.line()}", flush=True)
        return verdict
    chosen = [rec for rec in recs if rec.number in open_]
    gone = sorted(set(open_) - {rec.number for rec in chosen})
    if gone:
        print(f"resume: trial(s) {', '.join(map(str, gone))} on record are not in the study: "
              "not measured on", flush=True)  # fmt: skip
    print(f"resume: no finalist decided on record: measuring trial(s) "
          f"{', '.join(str(r.number) for r in chosen)} on from their pairs", flush=True)
    race = Race(ctx, baseline, chosen, deadline=deadline,
                floor=recorded_fraction((r.floor for r in rows), 0.0))  # fmt: skip
    race.delta = delta
    race.board = Board(out, "race")
    race.carry(rows)
    try:
        if any(entrant.out is None for entrant in race.entrants):
            race.run()
    finally:
        race.board.close()
        add_race_time(out, race.wall_s, race.measured_s)
    rows = rows + race.rows
    write_remeasure(path, rows)
    return verdict_from_rows(rows, delta)


def _warmed_up(rows: list[Remeasured]) -> set[int]:
    """The finalists a race on record built (its warm-up rows), paired or not."""
    return {r.trial for r in rows if r.pairing == WINDOW and r.role == FINALIST
            and r.trial is not None}  # fmt: skip


def _stands(verdict: Verdict, open_: list[int], deadline: float | None) -> str:
    """Why the verdict on record is not measured on ("": it is)."""
    if verdict.chosen is not None:
        return "decided"
    if not open_:
        if verdict.too_noisy:
            return "its undecided finalists ran in paired runs, which are not measured on"
        return "decided" if verdict.comparisons else "no finalist raced in paired windows"
    if verdict.measured_on >= MEASURE_ON_TIMES:
        return f"measured on {verdict.measured_on} times already, the most a race is"
    if deadline is not None and time.time() > deadline:
        return "the time budget is spent"
    return ""


def _env_change(ctx: TrialContext, env: dict[str, str], rec: TrialRecord) -> str:
    """Why ``rec`` needs fresh processes: the variables it sets otherwise than the baseline."""
    own = derive_plan(ctx, rec.params)[1]
    names = sorted(k for k in {*env, *own} if env.get(k) != own.get(k))
    return f"{', '.join(names)} need{'s' if len(names) == 1 else ''} fresh processes"


def _group_rows(
    ctx: TrialContext, baseline: TrialRecord, chosen: list[TrialRecord], start: int
) -> list[Remeasured]:
    """Group pairing: the interleaved sequence run for real (runs with the same environment
    variables share a worker group), then each disturbed run measured again, up to
    ``search.remeasure_repeats`` times, in the sequence's order."""
    order = interleave(baseline, chosen)
    plans = [derive_plan(ctx, rec.params) for rec in order]
    places = baseline.attrs.get(m.RANK_PLACES)  # where the search measured it
    nodes = pinnable(places, _alive_nodes()) if places else None
    results: list[list[dict]] = [[res] for res in measure_plans(
        ctx, plans, "remeasure", lambda i, res: _show(order, baseline, i, res, 0), nodes
    )]  # fmt: skip
    nodes = group_nodes(results[0][0].get(m.RANK_PLACES) or []) or nodes  # where B ran
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
            lambda k, res, r=repeat, again=again: _show(order, baseline, again[k], res, r), nodes,
        )  # fmt: skip
        for i, res in zip(again, redo, strict=True):
            results[i].append(res)
    why = disturbances(_runs(order, results, baseline))
    windows, delta = ctx.config.search.windows, ctx.config.search.verdict_delta
    return [
        Remeasured(
            position=start + i, repeat=k, trial=rec.number,
            role=BASELINE if rec is baseline else FINALIST,
            state=res.get(m.STATE), samples_per_s=res.get(m.SAMPLES_PER_S) or None,
            throughput_cv=res.get(m.THROUGHPUT_CV) or None, windows=windows,
            disturbed=why[i][k] or None, placement=res.get(m.PLACEMENT), pairing=GROUP,
            delta=delta, gpus=res.get(m.GPUS) or None,
        )
        for i, rec in enumerate(order)
        for k, res in enumerate(results[i])
    ]  # fmt: skip


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


def _where(res: dict) -> tuple[str | None, frozenset[str]]:
    """Where a measurement ran: its ranks per node, and the nodes (empty: not known)."""
    return res.get(m.PLACEMENT), frozenset(group_nodes(res.get(m.RANK_PLACES) or []))


def _measure(res: dict, where: tuple[str | None, frozenset[str]]) -> Measure:
    """A measurement as the verdict sees it: one whose ranks sat otherwise than the first
    baseline run's (``where``: another shape, or the same shape on other machines) does not
    compare, and counts as not completed."""
    label, nodes = _where(res)
    misplaced = (where[0] and (label or where[0]) != where[0]) or (
        where[1] and nodes and nodes != where[1])  # fmt: skip
    done = res.get(m.STATE) == m.COMPLETE and not misplaced
    return Measure(res[m.SAMPLES_PER_S] if done else None, res.get(m.THROUGHPUT_CV) or 0.0)


def _alive_nodes() -> set[str]:
    import ray

    return {node["NodeID"] for node in ray.nodes() if node.get("Alive")}


def _runs(order: list[TrialRecord], results: list[list[dict]], baseline: TrialRecord) -> list[Run]:
    runs, placement = [], _where(results[0][0])
    for rec, found in zip(order, results, strict=True):
        first = _measure(found[0], placement)
        repeats = tuple(_measure(res, placement) for res in found[1:])
        runs.append(Run(rec.number, rec is baseline, first.samples_per_s, first.cv, repeats))
    return runs
