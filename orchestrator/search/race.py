"""The verdict's paired windows: the baseline and the finalists kept built in one worker group,
measured window by window side by side until each is decided (a race).

Every configuration is built once (``TrialPlan.resident``) and warmed up; then, round after
round, each finalist due gets one pair: a baseline window and a window of its own, in
alternating order (``paired.pair_order``, by the finalist's own count), each of the
search's window and one step more, the first step after the switch counted in it
(``SWITCH_STEPS``). A window's figure is its mean step (``m.MEAN_SAMPLES_PER_S``:
what training pays for those steps), not the median the search ranks by (``WINDOW_FIGURE``).
Every finalist still in is due until it has ``MIN_PAIRS``; then
only the leader (the highest lower end) is: the pairs go where a keep is nearest, not split
among near twins (``Race._due``). After each pair its interval is updated
(``paired.PairedRatio``); a finalist leaves the race once decided against (no gain: its
one-sided ``paired.FUTILITY_CONFIDENCE`` bound below 1 + δ; slower: its interval below 1 - δ;
or its interval wholly below the leader's), and the race ends after the round in which a
finalist's interval lies wholly above 1 + δ, when none is left, or when the race's pairs are
spent: ``search.verdict_pairs`` per finalist, shared, so that those a finalist decided early
or waiting behind the leader did not use go to the others (then the verdict is "too noisy",
with the figures).
A keep is decided on the 95% interval's lower end.

The group is a ``GroupRun`` whose source is this race: it asks for the next window only after
the last one's outcome, so every decision sees every window so far.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from orchestrator.runfiles import Board
from orchestrator.runfiles.remeasure import BASELINE, FINALIST, WINDOW, Remeasured, Rows, read_rows
from orchestrator.search.group_run import GroupRun
from orchestrator.search.lease import Lease
from orchestrator.search.results import TrialRecord
from orchestrator.search.trial import TrialContext, derive_plan
from orchestrator.verdict.decide import KEEP, UNDECIDED, decide, measured_on
from orchestrator.verdict.paired import (
    FUTILITY_CONFIDENCE,
    MIN_PAIRS,
    PairedRatio,
    pair_order,
    ratios_from_rows,
)
from train_fns import metrics as m
from train_fns.plan import TrialPlan, steps_per_window

SWITCH_STEPS = 0
"""Unmeasured steps before every window (each follows another configuration's window): none,
the step after the switch counts in its window, which is one step longer than the search's
(``Race.steps``), so a pair costs the steps it would with that step unmeasured. The switch step
scatters as the others do, so whole visits pair tighter than the steps after the switch alone
and one interval takes fewer pairs (``python -m benchmarks.calibration.step_noise``; the
figures are in benchmarks/results/, the record named step-noise-switch-step). Under a median figure
a window that began with the switch step paired worse; under the mean (``WINDOW_FIGURE``) it does
not."""
WINDOW_FIGURE = m.MEAN_SAMPLES_PER_S
"""A window's figure in a pair: from its mean step, what training pays for the steps. A/A pairs
of windows scatter less from their means than from their medians, so the same interval takes
fewer pairs (``python -m benchmarks.calibration.step_noise``; the record named
step-noise-mean-median in benchmarks/results/). A neighbour's burst that slows one step shows in
the mean; a pair it ruins is left out as disturbed (``paired.PairedRatio``), one it only dents is
evidence, as it is for training."""
WARMUP_STEPS = 1
"""Unmeasured steps after a configuration is built, before its first window: its switch step
follows, and the correctness guard judged these configurations in the search already (its
figures are still taken on this step, not judged again)."""
REGROW_STEPS = 1
"""Steps each resident runs again after the last build, unpaired (``Race.warm_ups``)."""
GROUPS = 3
"""Worker groups a race may use: a hang or crash ends one, and the race goes on in another."""
FAILURES = 2
"""A configuration whose windows ended this many groups is out (the baseline: the race ends)."""
ENDS_GROUP = (m.HANG, m.CRASH, m.ERROR)
"""A window outcome that ended its worker group (an out-of-memory error does not)."""
@dataclass
class Entrant:
    """One configuration in the race (the baseline is one too, never judged)."""

    record: TrialRecord
    plan: TrialPlan
    windows: dict[int, float] = field(default_factory=dict)
    """This finalist's own window by round (the race's rounds: ``Race.next_pair``)."""
    baseline: dict[int, float] = field(default_factory=dict)
    """The baseline window paired with it, by round."""
    out: str | None = None
    """Why it left the race (None: still in)."""
    failures: int = 0
    """Windows of it that ended their worker group (hang, crash)."""
    floor: float = 0.0
    """The noise floor of its interval (``paired.noise_floor``)."""
    reference: float = 0.0
    """The baseline's search figure (``Race.reference``): its slow windows are disturbed
    (``paired.SLOW_WINDOW``)."""

    @property
    def measured(self) -> int:
        """Its complete pairs (both windows in), disturbed ones too."""
        return len(set(self.windows) & set(self.baseline))

    @property
    def paired(self) -> PairedRatio:
        done = sorted(set(self.windows) & set(self.baseline))
        ratios = tuple(self.windows[k] / self.baseline[k] for k in done)
        base = tuple(self.baseline[k] for k in done)
        return PairedRatio(ratios, self.floor, base, self.reference)


@dataclass(frozen=True)
class Slot:
    """One measurement the race asked for: whose window, for which finalist's pair."""

    who: Entrant
    against: Entrant | None
    """The finalist whose pair it belongs to (None: a warm-up after the build)."""
    pair: int | None


class Race:
    """Run the race in one worker group; ``rows`` is its part of remeasure.csv."""

    def __init__(
        self, ctx: TrialContext, baseline: TrialRecord, finalists: list[TrialRecord],
        say: Callable[[str], Any] = print, deadline: float | None = None, floor: float = 0.0,
        switch_steps: int = SWITCH_STEPS,
    ) -> None:  # fmt: skip
        search = ctx.config.search
        self.ctx, self.say = ctx, say
        self.board: Board | None = None
        """Each judged pair as TensorBoard scalars at its round (None: none)."""
        self.delta, self.max_pairs = search.verdict_delta, search.verdict_pairs
        window = steps_per_window(search.measure_steps, search.windows)
        self.switch_steps = switch_steps
        """Unmeasured steps before each window (``SWITCH_STEPS``; the A/A benchmark tries more)."""
        self.steps = max(1, window + 1 - switch_steps)
        """A window's measured steps: a visit is the search's window and one step more, the
        switch step counted in it unless ``switch_steps`` leaves it out."""
        self.base = self._entrant(baseline, BASELINE)
        self.entrants = [self._entrant(rec, f"trial{rec.number}") for rec in finalists]
        self.floor = floor
        self.reference = baseline.attrs.get(WINDOW_FIGURE) or baseline.value or 0.0
        """The baseline's search figure as a window's is taken (its mean steps; a study
        recorded before there were any: its median), for ``paired.SLOW_WINDOW``."""
        for entrant in self.entrants:
            entrant.floor, entrant.reference = floor, self.reference
        self.slots: list[Slot] = []
        self.rows: list[Remeasured] = []
        self.ended: str | None = None
        """Why the race stopped before a decision (a failed window, its group ending)."""
        self.broken: str | None = None
        """Why the current worker group ended (the race may go on in a fresh one)."""
        self.next_pair = 0
        """The round to measure next (a finalist due in it gets its pair of that index)."""
        self.position = 0
        """Rows written so far (a row's position in remeasure.csv)."""
        self.attempt = 0
        """The worker group the race runs in (0, then 1, ... after a hang or crash)."""
        self.finished = False
        """The current group's schedule ran to its end (it was not cut short)."""
        self.deadline = deadline
        """``search.time_budget_min`` as a ``time.time()``: no round starts after it."""
        self.carried = 0
        """Pairs on record this race measures on from (``carry``)."""
        self.racing = len(self.entrants)
        """Finalists the budget is given for: all, or those the pairs on record left in."""
        self.first_attempt = 0
        """The number of the race's first worker group (after those on record)."""
        self.race = 0
        """0, then 1, ... each time the race on record is measured on (``carry``)."""
        self.lent: Lease | None = None
        """The search's last group, lent (``search.lease``): the race's first group, warm
        already; None: the race starts its own."""
        self.wall_s, self.measured_s = 0.0, 0.0
        """The race's wall-clock (its groups' starts and warm-ups included), and of it its paired
        windows' measured steps: its part of the measured share of search time."""

    def carry(self, rows: Rows) -> None:
        """Measure on from a race on record (remeasure.csv's ``rows``): each finalist starts
        with its complete pairs there; rounds, rows and worker groups are numbered after the
        highest on record (so no new window can pair with an old one); those the pairs on
        record decide against leave before the first round, and the pair budget is those on
        record plus ``search.verdict_pairs`` for each finalist still in."""
        rows = read_rows(rows)
        found = ratios_from_rows(rows)
        for entrant in self.entrants:
            ratios, base = found.get(entrant.record.number, ([], []))
            entrant.baseline = dict(enumerate(base))
            entrant.windows = {k: r * b for k, (r, b) in enumerate(zip(ratios, base, strict=True))}
        self.carried = self.spent()
        paired = [r for r in rows if r.pairing == WINDOW]
        counts = max((e.measured for e in self.entrants), default=0)  # its own keys run to it
        self.next_pair = max([counts, *(1 + _whole(r.pair) for r in paired)])
        self.position = 1 + max((_whole(r.position) for r in rows), default=-1)
        self.first_attempt = 1 + max((_whole(r.attempt or 0) for r in paired), default=-1)
        self.attempt = self.first_attempt
        self.race = 1 + measured_on(rows)
        self._judge_round()
        self.racing = len(self._alive())

    def _entrant(self, rec: TrialRecord, key: str) -> Entrant:
        plan, _ = derive_plan(self.ctx, rec.params)
        return Entrant(rec, dataclasses.replace(plan, resident=key, prune_below=None))

    def run(self) -> list[Entrant]:
        """Race; returns the finalists with their pairs (each ``out`` says why it left). A
        group that hangs or crashes is ended and the race goes on in a fresh one (at most
        ``GROUPS`` in all), the pairs so far kept; a configuration that fails twice is out."""
        _, env = derive_plan(self.ctx, self.base.record.params)
        shown = ", ".join(f"trial {e.record.number}" for e in self._alive())
        most = f"at most {self.budget} pairs"
        if self.carried:
            most = f"{self.carried} pairs on record, at most {self.budget - self.carried} more"
        switch = self.switch_steps
        switch = f"after {switch} unmeasured" if switch else "the switch step counted"
        began = time.monotonic()
        self.say(
            f"race: {shown} against the baseline in paired windows (same processes, "
            f"{self.steps} steps each, {switch}, B c then c B), until decided at δ "
            f"{self.delta * 100:g}% "
            f"({most}{self._sharing()})"
        )
        try:
            self._attempts(env)
        finally:  # an interrupted race's time counts too (its windows' measured time does)
            self.wall_s += time.monotonic() - began
        return self.entrants

    def _attempts(self, env: dict[str, str]) -> None:
        """The race in one worker group after another, until it ends or ``GROUPS`` did."""
        for attempt in range(self.first_attempt, self.first_attempt + GROUPS):
            self.slots, self.broken, self.finished, self.attempt = [], None, False, attempt
            group = self.lent or GroupRun(self.ctx, f"verdict_{attempt}", owned=True,
                                          out=self.say)  # fmt: skip
            self.lent = None  # the lent group serves the first attempt only
            group.run(((plan, env) for plan in self._schedule()), self._take, label=self._label)
            if self.finished or not self._alive():
                return
            broken = self.broken or "its worker group ended before the race did"
            if self.ended is not None or attempt + 1 == self.first_attempt + GROUPS:
                self.ended = self.ended or broken
                return
            self.say(f"race: {broken}; going on in a fresh worker group, the pairs so far kept")

    def _sharing(self) -> str:
        """How several finalists share the race's pairs, in words (nothing for one)."""
        if len(self.entrants) < 2:
            return ""
        return (f" in all, {self.max_pairs} per finalist, shared: after {MIN_PAIRS} each, the "
                "rounds go to the leader, the highest lower end")  # fmt: skip

    def _label(self, index: int) -> str:
        slot = self.slots[index]
        name = self._name(slot.who)
        return (
            f"race: {name} warm-up" if slot.pair is None else f"race round {slot.pair + 1}: {name}"
        )

    def _name(self, who: Entrant) -> str:
        return BASELINE if who is self.base else f"trial {who.record.number}"

    def _schedule(self) -> Iterator[TrialPlan]:
        """Warm-ups, then rounds of one pair per finalist due, until the race ends."""
        yield from self.warm_ups()
        yield from self.rounds()
        self.finished = True

    def warm_ups(self) -> Iterator[TrialPlan]:
        """Each configuration built (kept resident) and warmed up, the baseline first; then
        each one step again (``REGROW_STEPS``): every build's guard empties the allocator's
        cache (``StepTimer.reset_peak``), so after the last build the residents built before
        it would regrow their working memory (cudaMalloc) inside round 0's measured steps,
        and only theirs: round 0's pairs would not be symmetric."""
        for again in (False, True):
            for who in (self.base, *self.entrants):
                if self.ended is None and (who is self.base or who.out is None):
                    steps = (0, REGROW_STEPS) if again else (WARMUP_STEPS, 1)
                    yield self._ask(who, None, None, *steps)

    def rounds(self) -> Iterator[TrialPlan]:
        """One pair per finalist due (``_due``), round after round, until the race is over."""
        while self.ended is None and self._alive() and not self._over(self.next_pair):
            pair = self.next_pair
            for entrant in self._due():
                if pair in entrant.windows and pair in entrant.baseline:
                    continue  # measured in a group that ended later in this round
                entrant.windows.pop(pair, None)  # half a pair: both windows again, together
                entrant.baseline.pop(pair, None)
                for role in pair_order(entrant.measured):
                    who = self.base if role == BASELINE else entrant
                    if self.ended is None and entrant.out is None:
                        yield self._ask(who, entrant, pair, self.switch_steps, self.steps)
            self.next_pair += 1
            self._judge_round()

    def _ask(
        self, who: Entrant, against: Entrant | None, pair: int | None, warmup: int, steps: int
    ) -> TrialPlan:
        self.slots.append(Slot(who, against, pair))
        return dataclasses.replace(who.plan, warmup_steps=warmup, measure_steps=steps,
                                   num_windows=1)  # fmt: skip

    def _alive(self) -> list[Entrant]:
        return [e for e in self.entrants if e.out is None]

    def _due(self) -> list[Entrant]:
        """Who gets a pair this round: every finalist still in that has fewer than
        ``MIN_PAIRS`` clean pairs (none is judged before), and the leader among the others (the
        highest lower end, the one the verdict would keep): one whose pairs came out disturbed
        does not hold the leader's rounds up. Split evenly, near twins each got half the pairs and
        neither decided; simulated races through this code, both rules side by side: the
        leader rule keeps real gains far more often and twins of the baseline never (the record
        named race-focus in benchmarks/results/). A leader decided against leaves, and the next
        one takes the rounds."""
        alive = self._alive()
        leader = self._leader(alive)
        return [e for e in alive if e.paired.pairs < MIN_PAIRS or e is leader]

    @staticmethod
    def _leader(among: list[Entrant]) -> Entrant | None:
        """The judged one (``MIN_PAIRS`` clean pairs) with the highest lower end: the one the
        verdict would keep (None: none judged yet)."""
        judged = [e for e in among if e.paired.pairs >= MIN_PAIRS]
        return max(judged, key=lambda e: e.paired.low, default=None)

    def _over(self, pair: int) -> bool:
        """After a round: a finalist is kept, or round ``pair`` would overdraw the pairs (a
        finalist whose pair of it is in already, measured before its group ended, owes none)."""
        alive = self._alive()
        if any(self._decision(e) == KEEP for e in alive) and pair >= MIN_PAIRS:
            return True
        if self.deadline is not None and time.time() > self.deadline:
            self.say("race: time budget spent: no further round")
            return True
        owed = sum(1 for e in self._due() if not (pair in e.windows and pair in e.baseline))
        return self.spent() + owed > self.budget

    @property
    def budget(self) -> int:
        """Pairs the whole race may measure: ``search.verdict_pairs`` per finalist (measuring
        on: per finalist still in, beside the pairs on record), so that those a finalist
        decided early leaves unused go to the ones still undecided."""
        return self.carried + self.max_pairs * self.racing

    def spent(self) -> int:
        """Pairs measured so far, every finalist's (those still to be measured again after a
        group ended are not counted)."""
        return sum(e.measured for e in self.entrants)

    def _decision(self, entrant: Entrant) -> str:
        paired = entrant.paired
        if paired.pairs < MIN_PAIRS:
            return UNDECIDED
        return decide(paired.low, paired.high, self.delta, paired.bound)

    def _judge_round(self) -> None:
        """After a round: out go the finalists decided against, and those whose interval lies
        wholly below the leader's (the highest lower end)."""
        alive = [e for e in self._alive() if e.paired.pairs >= MIN_PAIRS]
        for entrant in alive:
            decision = self._decision(entrant)
            if decision not in (KEEP, UNDECIDED):
                entrant.out = f"{decision} (decided after {entrant.paired.pairs} pairs)"
                self.say(f"race: trial {entrant.record.number} leaves the race: {entrant.out}")
        leader = self._leader(alive)
        for entrant in self._alive():
            if leader is not None and entrant is not leader and entrant.paired.pairs >= \
                    MIN_PAIRS and entrant.paired.high < leader.paired.low:  # fmt: skip
                entrant.out = f"slower than trial {leader.record.number} (decided)"
                self.say(f"race: trial {entrant.record.number} leaves the race: {entrant.out}")

    def _take(self, index: int, outcome: dict[str, Any]) -> None:
        """A window's outcome: recorded, and its pair judged when both windows are in."""
        slot = self.slots[index]
        done = outcome.get(m.STATE) == m.COMPLETE
        value = outcome.get(WINDOW_FIGURE) if done else None
        self.rows.append(self._row(slot, outcome, value))
        if not done:
            self._failed(slot.who, f"{outcome.get(m.STATE)}: {outcome.get(m.REASON)}",
                         outcome.get(m.STATE) in ENDS_GROUP)  # fmt: skip
            return
        if slot.pair is None:
            first = next(s for s in self.slots if s.who is slot.who and s.pair is None) is slot
            done = "built and warmed up" if first else "warm again after the last build"
            self.say(f"race: {self._name(slot.who)} {done} ({value:.2f} samples/s)")
            return
        self.measured_s += (outcome.get("timings") or {}).get("measured_s", 0.0)
        target = slot.against.baseline if slot.who is self.base else slot.against.windows
        target[slot.pair] = value
        if slot.pair in slot.against.windows and slot.pair in slot.against.baseline:
            self._show_pair(slot.against, slot.pair)

    def _failed(self, who: Entrant, why: str, group_ended: bool) -> None:
        """A window that did not complete: an out-of-memory error puts its configuration out
        (the baseline's ends the race); a hang or crash ends the group, and the second one of
        the same configuration puts it out."""
        self.say(f"race: {self._name(who)}: {why}")
        if group_ended:
            who.failures += 1
            self.broken = f"{self._name(who)}: {why}"
            if who.failures < FAILURES:
                return
        if who is self.base:
            self.ended = f"a baseline window did not complete ({why})"
        else:
            who.out = f"a window did not complete ({why})"

    def _show_pair(self, entrant: Entrant, pair: int) -> None:
        paired = entrant.paired
        mine, base = entrant.windows[pair], entrant.baseline[pair]
        so_far = (
            f"{paired.ratio:.3f}x (interval {paired.low:.3f}-{paired.high:.3f}, "
            f"{FUTILITY_CONFIDENCE:.0%} upper bound {paired.bound:.3f})"
            if paired.pairs >= 2
            else "an interval needs two"
        )
        if self.board is not None:
            figures = {"pair_ratio": mine / base, "samples_per_s": mine,
                       "baseline_samples_per_s": base, "ratio": paired.ratio}  # fmt: skip
            if paired.pairs >= 2:  # an interval needs two
                figures.update(interval_low=paired.low, interval_high=paired.high)
            self.board.add(figures, pair + 1, f"race/trial_{entrant.record.number}/")
        measured = entrant.measured
        out = len(paired.disturbed)
        left = f", {out} disturbed left out" if out else ""
        self.say(
            f"race round {pair + 1}: trial {entrant.record.number} {mine:.2f} vs baseline "
            f"{base:.2f} samples/s = {mine / base:.3f}; after {measured} pair"
            f"{'s' if measured > 1 else ''}{left}: {so_far}"
        )

    def _row(self, slot: Slot, outcome: dict[str, Any], value: float | None) -> Remeasured:
        """Its remeasure.csv row (window pairing: a warm-up has no pair)."""
        self.position += 1
        return Remeasured(
            position=self.position - 1, repeat=0, trial=slot.who.record.number,
            role=BASELINE if slot.who is self.base else FINALIST,
            state=outcome.get(m.STATE), samples_per_s=value or None, windows=1,
            placement=outcome.get(m.PLACEMENT), pairing=WINDOW, pair=slot.pair,
            against=None if slot.against is None else slot.against.record.number,
            attempt=self.attempt, floor=self.floor, reference=self.reference or None,
            delta=self.delta, race=self.race, gpus=outcome.get(m.GPUS) or None,
        )  # fmt: skip


def _whole(value: int | None) -> int:
    """A recorded position, pair or attempt (-1: none recorded)."""
    return -1 if value is None else value
