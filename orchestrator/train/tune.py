"""Tune while training (``orchestrator.train --tune``): the judge that races candidate settings
(an accumulation split, a DDP bucket size: ``tune_knobs``) against the running one in paired
windows of real training steps.

Every window is training: the run's one model advances with the same samples in the same order
whatever setting runs it (a re-split keeps the global batch, a re-bucketing the gradients,
``train_fns.online``), so a window spent on a candidate costs only the difference in speed,
not the step. The judge lives on the
driver (an actor, ``start_judge``), one per run, and keeps each world size's state across the
worker group's restarts; rank 0 asks it after every window what the next one runs.

Per world size that has no decided entry it goes through:

1. ``WARMUP_WINDOWS`` windows of the running split, not measured (a start's first steps
   allocate and, under DDP, rebuild buckets);
2. ``FLOOR_WINDOWS`` of it measured, whose spread is the noise floor of the pairs to come
   (``verdict.paired.noise_floor``: the race's own floor, where the search measured it);
3. each candidate in turn: one settling window (the switch's one-off costs, counted as spent,
   not filed), then windows paired with the running setting's, B c, c B, ..., judged after
   every pair by the verdict's one rule (``verdict.decide``) against δ: kept (it becomes the
   running setting), or dropped (no gain, slower, undecided at ``max_pairs`` pairs, cut short by
   the group's end or by the budget, or refused by the guard);
4. done: the size's kept setting is its entry (``entries``), and no window is asked for again.

Candidates change one knob of the running setting, accumulation first, then buckets:

- the accumulation values the space offers (divisors of the per-rank batch) with more
  micro-batches than the running split's, up to ``train.max_accumulation``, nearest first: a
  micro-batch larger than the one the run started with is never tried, as it might not fit in
  memory; none where DDP's ``static_graph`` is on (torch breaks it with accumulation);
- under DDP on more than one worker, the bucket sizes the run's spaces offer
  (``search.spaces``' ``bucket_cap_mb``), nearest the running one first.

A re-split runs the same samples through the same model: nothing for a guard to catch. A new
bucket size is a new DDP wrapper: the judge refuses one whose first step's gradients are not
the running setting's (``checked``). NCCL variables are read once per process: not switched
live (a restart the run has anyway could try them; it does not yet).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.config.schema import ConfigError
from orchestrator.runfiles import TUNED_SIZES_YAML, setting_text
from orchestrator.runfiles.remeasure import BASELINE, FINALIST
from orchestrator.train.snapshots import driver_actor
from orchestrator.train.tune_files import write_tuned_sizes
from orchestrator.train.tune_knobs import (
    ACCUMULATION,
    BUCKETS,
    Candidate,
    Setting,
    bucket_candidates,
    candidates_of,
    tuned_entry,
    with_candidate,
)
from orchestrator.verdict.decide import KEEP, UNDECIDED, decide
from orchestrator.verdict.paired import MIN_PAIRS, PairedRatio, noise_floor, pair_order

WARMUP_WINDOWS = 2
"""Windows after each start of the group that are not measured."""
FLOOR_WINDOWS = 4
"""Windows of the running split measured for the noise floor: they train as any other, so
more would cost nothing but time before the first candidate."""
BUDGET_SPENT = "budget spent"
"""A size's outcome when ``train.tune_budget`` ran out before every candidate was judged (and the
decision on a candidate it cut short)."""
GUARD = "refused by the guard"
"""The decision on a candidate whose first step's gradients differ from the running setting's
by more than the guard's tolerance: it never trains a window."""
INTERRUPTED = "interrupted"
"""The decision on a candidate whose worker group ended while it raced: it is not raced again
(a candidate that makes the group fail must not use up its restarts)."""


@dataclass(frozen=True)
class TuneSettings:
    """What the judge is told by the run's config."""

    window_steps: int
    """Steps a window holds (``train.tune_window``)."""
    budget_steps: int
    """Steps each size may spend on candidates (``train.tune_budget`` x ``train.steps``)."""
    delta: float
    """The threshold a kept candidate's interval must clear (``search.verdict_delta``)."""
    max_pairs: int
    """Pairs a candidate gets before it is dropped undecided (``search.verdict_pairs``)."""
    max_accumulation: int
    """The most micro-batches per step a candidate may have (``train.max_accumulation``)."""
    bucket_choices: tuple[float, ...] = ()
    """The DDP bucket sizes (MB) a size may try (the spaces'; none: buckets are not tuned)."""
    tolerance: float = 1e-3
    """The guard's relative tolerance on a switch's gradients (``guard.tolerance_for``)."""


@dataclass
class Spent:
    """Candidate windows' steps and seconds, and the seconds over what the running split would
    have taken for those steps (from the paired baseline window's speed)."""

    steps: int = 0
    seconds: float = 0.0
    extra_s: float = 0.0

    def add(self, other: Spent) -> None:
        self.steps += other.steps
        self.seconds += other.seconds
        self.extra_s += other.extra_s

    def figures(self) -> dict[str, float]:
        return {"steps": self.steps, "seconds": round(self.seconds, 3),
                "extra_s": round(self.extra_s, 3)}  # fmt: skip


@dataclass
class Size:
    """One world size's tuning: where it stands, what it measured, what it kept."""

    world: int
    running: Setting
    """The setting the run trains with now at this size."""
    candidates: list[Candidate]
    start: Setting = field(default_factory=dict)
    """The setting the size started from (its entry leaves out the knobs still at it)."""
    warmup: int = WARMUP_WINDOWS
    floor_speeds: list[float] = field(default_factory=list)
    floor: float | None = None
    candidate: Candidate | None = None
    ratios: list[float] = field(default_factory=list)
    baselines: list[float] = field(default_factory=list)
    pair: dict[str, float] = field(default_factory=dict)
    """The pair being measured: each role's speed (steps/s), and the candidate's seconds."""
    now: str = BASELINE
    """The role of the window running now (``BASELINE``: the running split)."""
    settling: bool = False
    """The window running now is a new candidate's first, not filed (``_record``)."""
    passed: bool = False
    """The guard passed the candidate now raced (``Judge.checked``)."""
    spent: Spent = field(default_factory=Spent)
    """Every candidate's windows at this size (the budget counts them)."""
    trying: Spent = field(default_factory=Spent)
    """The candidate now raced."""
    lost: Spent = field(default_factory=Spent)
    """The candidates that were not kept: the cost of tuning."""
    decisions: list[dict[str, Any]] = field(default_factory=list)
    outcome: str | None = None
    """None while tuning; then why it ended (every candidate judged, or the budget spent)."""

    def setting(self) -> Setting:
        """What the window running now trains with."""
        trying = self.now == FINALIST and self.candidate is not None
        return with_candidate(self.running, self.candidate if trying else None)

    def checks(self) -> bool:
        """The window about to run is a new bucket size's first: the guard checks it first."""
        return bool(self.settling and self.candidate and self.candidate[0] != ACCUMULATION
                    and not self.passed)  # fmt: skip

    def entry(self) -> dict[str, Any]:
        """This size's decided setting in best.yaml's ``sizes`` format; its verdict says how it
        ended (every candidate judged, or the budget spent before)."""
        kept = [d for d in self.decisions if d["outcome"] == KEEP]
        verdict = f"online: no candidate beat {setting_text(self.running)}"
        if kept:
            verdict = (f"online: {setting_text(kept[-1]['candidate'])} kept at "
                       f"{kept[-1]['ratio']:.2f}x {setting_text(kept[-1]['running'])}")  # fmt: skip
        verdict += f" ({self.outcome}; {len(self.decisions)} candidate(s) judged)"
        return {"tuned": tuned_entry(self.running, self.start), "env": {}, "verdict": verdict}


class Judge:
    """Decides what each window trains with, from the windows before it (see the module)."""

    def __init__(self, settings: TuneSettings, fixed: set[int],
                 prior: dict[int, dict[str, Any]], out: Path | None) -> None:  # fmt: skip
        """``fixed``: sizes the config's own entries decide (best.yaml's), never tuned;
        ``prior``: the entries a run before this ``--resume`` decided (``read_tuned_sizes``);
        ``out``: the run folder each decided size's entry is written to (None: nowhere)."""
        self.settings, self.fixed, self.out = settings, set(fixed), out
        self.prior = dict(prior)
        self.decided = {w: dict(e["tuned"]) for w, e in prior.items()}
        self.sizes: dict[int, Size] = {}

    def begin(self, world: int, per_rank: int, running: Setting,
              split_fixed: bool = False) -> dict[str, Any]:  # fmt: skip
        """A start of the group at ``world`` ranks, each with ``per_rank`` samples a step, on
        the ``running`` setting (its split, and its bucket size where buckets can switch): what
        its first window trains with. ``split_fixed``: the split cannot change (DDP's
        ``static_graph``). An undecided size starts its tuning over, keeping what it kept and
        spent before (the pairs of a group that ended are not paired with the new one's)."""
        if world in self.fixed:
            return _skip(world, running, "the config's entry")
        kept = self.decided.get(world)
        if kept is not None and _fits(kept, running, per_rank, split_fixed):
            return _skip(world, {**running, **{k: v for k, v in kept.items() if k in running}},
                         f"{TUNED_SIZES_YAML}'s entry")  # fmt: skip
        before, events = self.sizes.get(world), []
        if before is not None:
            running = before.running
            if before.candidate is not None:  # raced when its group ended: not raced again
                events.append(self._decide(before, INTERRUPTED, self._paired(before)))
        todo = self.candidates(per_rank, running, split_fixed)
        if before is not None:
            judged = {(k, v) for d in before.decisions for k, v in d["candidate"].items()}
            todo = [c for c in todo if c not in judged]
        if not todo and not (before and before.decisions):  # nothing to race: no entry
            return _skip(world, running, "no candidate: no smaller micro-batch splits the "
                         "per-rank batch within train.max_accumulation, and no bucket size "
                         "switches (DDP on more than one worker, a space offering "
                         "bucket_cap_mb)")  # fmt: skip
        size = Size(world, running, todo, start=before.start if before else dict(running))
        if before is not None:
            size.spent, size.lost, size.decisions = before.spent, before.lost, before.decisions
        self.sizes[world] = size
        if not todo:  # every candidate judged before the restart: decided
            size.outcome = "every candidate judged"
            events.append(self._finish(size))
            return _answer(running, running, done=True, events=events)
        events.append({"kind": "tune_start", "world": world, "running": running,
                       "candidates": [dict([c]) for c in todo]})  # fmt: skip
        return _answer(running, running, events=events)

    def candidates(self, per_rank: int, running: Setting, split_fixed: bool) -> list[Candidate]:
        """What a size races against ``running``, in order: the accumulation values above its
        split (``candidates_of``), then the bucket sizes the spaces offer where buckets switch
        (``bucket_candidates``); a restart leaves out the ones judged. The A/A benchmark
        (``benchmarks/calibration/tune_aa.py``) races twins of ``running`` instead, in a run
        without restarts."""
        splits = [] if split_fixed else candidates_of(
            per_rank, int(running[ACCUMULATION]), self.settings.max_accumulation)  # fmt: skip
        todo = [(ACCUMULATION, float(a)) for a in splits]
        if BUCKETS in running:
            todo += [(BUCKETS, mb) for mb in
                     bucket_candidates(running[BUCKETS], self.settings.bucket_choices)]  # fmt: skip
        return todo

    def window(self, world: int, seconds: float, steps: int) -> dict[str, Any]:
        """The window just ended at ``world`` ranks took ``seconds`` for ``steps`` steps:
        what the next one trains with (``done``: no more windows are asked for)."""
        size = self.sizes[world]  # rank 0 begins every start: a size unknown here is a defect
        if size.outcome is not None:
            return _answer(size.running, size.running, done=True)
        events = self._record(size, steps / seconds if seconds > 0 else 0.0, steps, seconds)
        if size.outcome is None:
            events += self._schedule(size)
        return self._next(size, events)

    def checked(self, world: int, gap: float) -> dict[str, Any]:
        """The workers switched to the candidate about to settle and found its first step's
        gradients ``gap`` (relative) from the running setting's: within the guard's tolerance
        it trains its windows; beyond it (or not finite) it is refused before any window."""
        size = self.sizes[world]
        if not size.checks():  # nothing was asked: a stale call changes nothing
            return _answer(size.setting(), size.running, done=size.outcome is not None)
        check = {"kind": "tune_check", "world": world, "running": dict(size.running),
                 "candidate": dict([size.candidate]), "gap": gap if math.isfinite(gap) else None,
                 "tolerance": self.settings.tolerance}  # fmt: skip
        if math.isfinite(gap) and gap <= self.settings.tolerance:
            size.passed = True
            return self._next(size, [check])
        decision = self._decide(size, GUARD, self._paired(size))
        return self._next(size, [check, decision, *self._schedule(size)])

    def _next(self, size: Size, events: list[dict[str, Any]]) -> dict[str, Any]:
        """The answer after ``events``: the next window's setting, the end written once."""
        if size.outcome is not None:
            events.append(self._finish(size))
        return _answer(size.setting(), size.running, done=size.outcome is not None,
                       check=size.checks(), events=events)  # fmt: skip

    def _record(self, size: Size, speed: float, steps: int, seconds: float) -> list[dict]:
        """Take one window: a warm-up's is dropped, a floor window kept, a candidate's first
        (settling) window counted but not filed, a pair's half filed."""
        if size.warmup:
            size.warmup -= 1
            return []
        if size.floor is None:
            size.floor_speeds.append(speed)
            if len(size.floor_speeds) == FLOOR_WINDOWS:
                size.floor = _floor(size.floor_speeds)
            return []
        if size.now == FINALIST:  # its cost against the running split's nearest speed
            near = size.pair.get(BASELINE) or (size.baselines or size.floor_speeds)[-1]
            size.trying.steps += steps
            size.trying.seconds += seconds
            size.trying.extra_s += seconds - steps / near
        if size.settling:
            size.settling = False
            return []
        size.pair[size.now] = speed
        if BASELINE in size.pair and FINALIST in size.pair:
            return self._judge_pair(size)
        return []

    def _judge_pair(self, size: Size) -> list[dict[str, Any]]:
        """A finished pair: its ratio, the interval so far, and the decision once there is
        one (from ``MIN_PAIRS`` pairs; undecided at ``max_pairs`` drops the candidate)."""
        pair, size.pair = size.pair, {}
        size.ratios.append(pair[FINALIST] / pair[BASELINE])
        size.baselines.append(pair[BASELINE])
        paired = self._paired(size)
        outcome = UNDECIDED
        if paired.pairs >= MIN_PAIRS:  # clean pairs: a disturbed one is no evidence
            outcome = decide(paired.low, paired.high, self.settings.delta, paired.bound)
        events = [{"kind": "tune_pair", "world": size.world, "running": size.running,
                   "candidate": dict([size.candidate]) if size.candidate else {},
                   "pair": len(size.ratios),
                   "ratio": size.ratios[-1], **_interval_of(paired)}]  # fmt: skip
        if outcome != UNDECIDED or len(size.ratios) >= self.settings.max_pairs:
            events.append(self._decide(size, outcome, paired))
        return events

    def _decide(self, size: Size, outcome: str, paired: PairedRatio) -> dict[str, Any]:
        """Keep the candidate (it becomes the running split) or drop it (its windows are the
        cost of tuning); the next window starts the next candidate."""
        decision = {"kind": "tune_decision", "world": size.world, "running": dict(size.running),
                    "candidate": dict([size.candidate]) if size.candidate else {},
                    "outcome": outcome, "ratio": paired.ratio,
                    **_interval_of(paired), "pairs": paired.pairs,
                    **size.trying.figures()}  # fmt: skip
        if outcome == KEEP:
            size.running = with_candidate(size.running, size.candidate)
        else:
            size.lost.add(size.trying)
        size.spent.add(size.trying)
        size.decisions.append(decision)
        size.candidate, size.ratios, size.baselines, size.trying = None, [], [], Spent()
        size.pair, size.settling, size.passed = {}, False, False
        return decision

    def _paired(self, size: Size) -> PairedRatio:
        """The pairs of the candidate now raced, as the verdict reads them."""
        reference = statistics.fmean(size.floor_speeds) if size.floor_speeds else 0.0
        return PairedRatio(tuple(size.ratios), size.floor or 0.0, tuple(size.baselines), reference)

    def _schedule(self, size: Size) -> list[dict[str, Any]]:
        """The role of the next window: the running split until the floor is measured, then
        the pairs of each candidate in turn (B c, then c B); the end once every candidate is
        judged or a candidate's next window would overrun the budget (a decision on the one
        it cuts short)."""
        if size.warmup or size.floor is None:
            size.now = BASELINE
            return []
        if size.candidate is None:
            if not size.candidates:
                size.outcome = "every candidate judged"
                return []
            size.candidate, size.settling = size.candidates.pop(0), True
            size.now = FINALIST  # its first window settles the switch: one-off costs, unfiled
        else:
            first, second = pair_order(len(size.ratios))
            size.now = second if first in size.pair else first
        over = size.spent.steps + size.trying.steps + self.settings.window_steps
        if size.now != FINALIST or over <= self.settings.budget_steps:
            return []
        cut = [self._decide(size, BUDGET_SPENT, self._paired(size))] if size.trying.steps else []
        size.candidate, size.now, size.outcome = None, BASELINE, BUDGET_SPENT
        return cut

    def _finish(self, size: Size) -> dict[str, Any]:
        """The size is decided: its entry is written, the run trains on with its split."""
        self.decided[size.world] = dict(size.running)
        self._write()
        return {"kind": "tune_done", "world": size.world, "running": size.running,
                "outcome": size.outcome, "lost": size.lost.figures()}  # fmt: skip

    def entries(self) -> dict[int, dict[str, Any]]:
        """Every size decided online (by this run, or the one it resumes), in best.yaml's
        ``sizes`` format."""
        done = {w: s.entry() for w, s in self.sizes.items() if s.outcome is not None}
        return dict(sorted({**self.prior, **done}.items()))

    def _write(self) -> None:
        if self.out is not None:
            write_tuned_sizes(self.out, self.entries())

    def summary(self) -> dict[str, Any]:
        """What tuning did, per size and in all: summary.json's ``tune``."""
        sizes = {str(w): {"running": s.running, "outcome": s.outcome or "tuning",
                          "decisions": s.decisions, "lost": s.lost.figures(),
                          "spent": s.spent.figures()}
                 for w, s in sorted(self.sizes.items())}  # fmt: skip
        lost = Spent()
        for size in self.sizes.values():
            lost.add(size.lost)
        return {"sizes": sizes, "lost": lost.figures()}


def _floor(speeds: list[float]) -> float:
    """The noise floor of a pair's log ratio from the running split's windows (their cv, as
    the search's trials give it to the race)."""
    cv = statistics.pstdev(speeds) / statistics.fmean(speeds)
    return noise_floor([cv], len(speeds))


def _fits(kept: Setting, running: Setting, per_rank: int, split_fixed: bool) -> bool:
    """A decided entry's split runs at this start: it splits the per-rank batch, its
    micro-batch is no larger than the start's (memory), and it is the start's where the split
    cannot change."""
    split, start = int(kept.get(ACCUMULATION, 0)), int(running[ACCUMULATION])
    if split_fixed:
        return split == start
    return split >= start and per_rank % split == 0


def _skip(world: int, setting: Setting, why: str) -> dict[str, Any]:
    """The answer for a size that is not tuned: its entry's setting, said once a start."""
    event = {"kind": "tune_skip", "world": world, "running": setting, "why": why}
    return _answer(setting, setting, done=True, events=[event])


def _answer(setting: Setting, running: Setting, done: bool = False, check: bool = False,
            events: list | None = None) -> dict[str, Any]:  # fmt: skip
    """What rank 0 is told: the next window's setting, the size's running setting (what the
    run keeps should the judge stop answering), whether the guard checks the switch first,
    whether tuning is done, and what to log."""
    return {"setting": dict(setting), "running": dict(running), "done": done, "check": check,
            "events": events or []}  # fmt: skip


def _interval_of(paired: PairedRatio) -> dict[str, float | None]:
    """The interval's ends for an event; None where the pairs give none (JSON has no inf)."""
    return {"low": paired.low if math.isfinite(paired.high) else None,
            "high": paired.high if math.isfinite(paired.high) else None}  # fmt: skip


def check_budget(config: Any) -> None:
    """``train.tune_budget`` leaves room to judge a candidate: its settling window and
    ``MIN_PAIRS`` pairs of windows, or a ConfigError naming the keys (before Ray starts)."""
    train = config.train
    budget, need = int(train.tune_budget * train.steps), (MIN_PAIRS + 1) * train.tune_window
    if train.tune == "online" and budget < need:
        raise ConfigError("train.tune_budget", f"{train.tune_budget:g} x train.steps="
                          f"{train.steps} is {budget} steps a size may spend on candidates; "
                          f"judging one takes at least {need} ({MIN_PAIRS + 1} windows of "
                          f"train.tune_window={train.tune_window}): raise train.tune_budget or "
                          "train.steps, or lower train.tune_window")  # fmt: skip


def start_judge(settings: TuneSettings, fixed: set[int], prior: dict[int, dict[str, Any]],
                out: Path) -> Any:  # fmt: skip
    """The run's judge, an actor on the driver's node (as the snapshot keeper: a lost worker
    node does not take it along), writing ``tuned_sizes.yaml`` into ``out``."""
    return driver_actor(Judge, settings, fixed, prior, out.resolve())
