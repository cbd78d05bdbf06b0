"""Tune while training (``orchestrator.train --tune``): the judge that races accumulation splits
against the running one in paired windows of real training steps.

Every window is training: the run's one model advances with the same samples in the same order
whatever split runs it (a re-split keeps the global batch, ``train_fns.online``), so a window
spent on a candidate costs only the difference in speed, not the step. The judge lives on the
driver (an actor, ``start_judge``), one per run, and keeps each world size's state across the
worker group's restarts; rank 0 asks it after every window what the next one runs.

Per world size that has no decided entry it goes through:

1. ``WARMUP_WINDOWS`` windows of the running split, not measured (a start's first steps
   allocate and, under DDP, rebuild buckets);
2. ``FLOOR_WINDOWS`` of it measured, whose spread is the noise floor of the pairs to come
   (``verdict.paired.noise_floor``: the race's own floor, where the search measured it);
3. each candidate in turn: one settling window (the switch's one-off costs, counted as spent,
   not filed), then windows paired with the running split's, B c, c B, ..., judged after every
   pair by the verdict's one rule (``verdict.decide``) against δ: kept (it becomes the running
   split), or dropped (no gain, slower, undecided at ``max_pairs`` pairs, or cut short by the
   group's end or by the budget);
4. done: the size's kept split is its entry (``entries``), and no window is asked for again.

Candidates are the accumulation values the space offers (divisors of the per-rank batch) with
more micro-batches than the running split's, up to ``train.max_accumulation``: a micro-batch
larger than the one the run started with is never tried, as it might not fit in memory. Only
what a live process can switch is tuned: NCCL variables are read once per process, so they are
not (a restart the run has anyway could try them; it does not yet).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.config.schema import ConfigError
from orchestrator.runfiles import TUNED_SIZES_YAML
from orchestrator.runfiles.remeasure import BASELINE, FINALIST
from orchestrator.train.snapshots import driver_actor
from orchestrator.train.tune_files import write_tuned_sizes
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
    running: int
    """The accumulation the run trains with now at this size."""
    candidates: list[int]
    warmup: int = WARMUP_WINDOWS
    floor_speeds: list[float] = field(default_factory=list)
    floor: float | None = None
    candidate: int | None = None
    ratios: list[float] = field(default_factory=list)
    baselines: list[float] = field(default_factory=list)
    pair: dict[str, float] = field(default_factory=dict)
    """The pair being measured: each role's speed (steps/s), and the candidate's seconds."""
    now: str = BASELINE
    """The role of the window running now (``BASELINE``: the running split)."""
    settling: bool = False
    """The window running now is a new candidate's first, not filed (``_record``)."""
    spent: Spent = field(default_factory=Spent)
    """Every candidate's windows at this size (the budget counts them)."""
    trying: Spent = field(default_factory=Spent)
    """The candidate now raced."""
    lost: Spent = field(default_factory=Spent)
    """The candidates that were not kept: the cost of tuning."""
    decisions: list[dict[str, Any]] = field(default_factory=list)
    outcome: str | None = None
    """None while tuning; then why it ended (every candidate judged, or the budget spent)."""

    def accumulation(self) -> int:
        """What the window running now trains with."""
        return self.candidate if self.now == FINALIST and self.candidate else self.running

    def entry(self) -> dict[str, Any]:
        """This size's decided split in best.yaml's ``sizes`` format; its verdict says how it
        ended (every candidate judged, or the budget spent before)."""
        kept = [d for d in self.decisions if d["outcome"] == KEEP]
        verdict = f"online: no candidate beat accumulation {self.running}"
        if kept:
            verdict = (f"online: accumulation {self.running} kept at {kept[-1]['ratio']:.2f}x "
                       f"accumulation {kept[-1]['running']}")  # fmt: skip
        verdict += f" ({self.outcome}; {len(self.decisions)} candidate(s) judged)"
        return {"tuned": {"accumulation_steps": self.running}, "env": {}, "verdict": verdict}


def candidates_of(per_rank: int, running: int, max_accumulation: int) -> list[int]:
    """Accumulation values a size may try, nearest first: divisors of the per-rank batch with
    more micro-batches than ``running`` (so a smaller micro-batch), at most
    ``max_accumulation``."""
    return [a for a in range(running + 1, min(per_rank, max_accumulation) + 1) if per_rank % a == 0]


class Judge:
    """Decides what each window trains with, from the windows before it (see the module)."""

    def __init__(self, settings: TuneSettings, fixed: set[int],
                 prior: dict[int, dict[str, Any]], out: Path | None) -> None:  # fmt: skip
        """``fixed``: sizes the config's own entries decide (best.yaml's), never tuned;
        ``prior``: the entries a run before this ``--resume`` decided (``read_tuned_sizes``);
        ``out``: the run folder each decided size's entry is written to (None: nowhere)."""
        self.settings, self.fixed, self.out = settings, set(fixed), out
        self.prior = dict(prior)
        self.decided = {w: int(e["tuned"]["accumulation_steps"]) for w, e in prior.items()}
        self.sizes: dict[int, Size] = {}

    def begin(self, world: int, per_rank: int, running: int) -> dict[str, Any]:
        """A start of the group at ``world`` ranks, each with ``per_rank`` samples a step split
        ``running`` ways: what its first window trains with. An undecided size starts its
        tuning over, keeping what it kept and spent before (the pairs of a group that ended are
        not paired with the new one's)."""
        if world in self.fixed:
            return _skip(world, running, "the config's entry")
        kept = self.decided.get(world)
        if kept is not None and kept >= running and per_rank % kept == 0:
            return _skip(world, kept, f"{TUNED_SIZES_YAML}'s entry")
        before, events = self.sizes.get(world), []
        if before is not None:
            running = before.running
            if before.candidate is not None:  # raced when its group ended: not raced again
                events.append(self._decide(before, INTERRUPTED, self._paired(before)))
        todo = self.candidates(per_rank, running)
        if before is not None:
            judged = {d["candidate"] for d in before.decisions}
            todo = [a for a in todo if a not in judged]
        if not todo and not (before and before.decisions):  # nothing to race: no entry
            return _skip(world, running, "no candidate: no smaller micro-batch splits the "
                         "per-rank batch within train.max_accumulation")  # fmt: skip
        size = Size(world, running, todo)
        if before is not None:
            size.spent, size.lost, size.decisions = before.spent, before.lost, before.decisions
        self.sizes[world] = size
        if not todo:  # every candidate judged before the restart: decided
            size.outcome = "every candidate judged"
            events.append(self._finish(size))
            return _answer(running, running, done=True, events=events)
        events.append({"kind": "tune_start", "world": world, "running": running,
                       "candidates": todo})  # fmt: skip
        return _answer(running, running, events=events)

    def candidates(self, per_rank: int, running: int) -> list[int]:
        """What a size races against ``running``, in order: distinct accumulation values above
        it (``candidates_of``; a restart leaves out the values judged). The A/A benchmark
        (``benchmarks/calibration/tune_aa.py``) races twins of ``running`` instead, in a run
        without restarts."""
        return candidates_of(per_rank, running, self.settings.max_accumulation)

    def window(self, world: int, seconds: float, steps: int) -> dict[str, Any]:
        """The window just ended at ``world`` ranks took ``seconds`` for ``steps`` steps:
        what the next one trains with (``done``: no more windows are asked for)."""
        size = self.sizes[world]  # rank 0 begins every start: a size unknown here is a defect
        if size.outcome is not None:
            return _answer(size.running, size.running, done=True)
        events = self._record(size, steps / seconds if seconds > 0 else 0.0, steps, seconds)
        if size.outcome is None:
            events += self._schedule(size)
        if size.outcome is not None:
            events.append(self._finish(size))
        return _answer(size.accumulation(), size.running, done=size.outcome is not None,
                       events=events)  # fmt: skip

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
                   "candidate": size.candidate, "pair": len(size.ratios),
                   "ratio": size.ratios[-1], **_interval_of(paired)}]  # fmt: skip
        if outcome != UNDECIDED or len(size.ratios) >= self.settings.max_pairs:
            events.append(self._decide(size, outcome, paired))
        return events

    def _decide(self, size: Size, outcome: str, paired: PairedRatio) -> dict[str, Any]:
        """Keep the candidate (it becomes the running split) or drop it (its windows are the
        cost of tuning); the next window starts the next candidate."""
        decision = {"kind": "tune_decision", "world": size.world, "running": size.running,
                    "candidate": size.candidate, "outcome": outcome, "ratio": paired.ratio,
                    **_interval_of(paired), "pairs": paired.pairs,
                    **size.trying.figures()}  # fmt: skip
        if outcome == KEEP:
            size.running = size.candidate or size.running
        else:
            size.lost.add(size.trying)
        size.spent.add(size.trying)
        size.decisions.append(decision)
        size.candidate, size.ratios, size.baselines, size.trying = None, [], [], Spent()
        size.pair, size.settling = {}, False
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
        self.decided[size.world] = size.running
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


def _skip(world: int, accumulation: int, why: str) -> dict[str, Any]:
    """The answer for a size that is not tuned: its entry's split, said once a start."""
    event = {"kind": "tune_skip", "world": world, "running": accumulation, "why": why}
    return _answer(accumulation, accumulation, done=True, events=[event])


def _answer(accumulation: int, running: int, done: bool = False,
            events: list | None = None) -> dict[str, Any]:  # fmt: skip
    """What rank 0 is told: the next window's split, the size's running split (what the run
    keeps should the judge stop answering), whether tuning is done, and what to log."""
    return {"accumulation_steps": accumulation, "running": running, "done": done,
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
