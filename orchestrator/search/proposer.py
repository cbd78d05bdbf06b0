"""Which configurations the search measures next: staged search and cost-model seeds.

A trial costs minutes, so the order of the first few matters more than the sampler's
asymptotics. ``staged`` (after DeepSpeed autotuning's fast mode, and AutoCCL's split of the
NCCL space into small independent subspaces) spends the budget in three stages:

1. memory shape: the memory-shaping choices (:data:`MEMORY_PARAMS`) with every
   communication knob at its default, ordered by the cost model's seeds when the budget
   cannot hold them all, because they decide what fits and how much compute there is;
2. communication: from the best completed trial, each knob's values one at a time with the
   others at the current best (coordinate descent: linear in the knobs, not their product);
3. joint refinement: nothing is enqueued and the TPE sampler takes over, with everything
   measured so far as its history, until its trials stop improving (:meth:`Proposer.settled`).

Every decision is recomputed from the study's contents (completed trials and what is
already queued), so a restarted driver carries on where the dead one stopped, and no
configuration is ever queued twice. Nor is one measured twice, whatever the strategy: a
sampler on a finite grid proposes configurations it has already seen (TPE most, once it has
converged), and each would spend a trial of minutes on what the study knows;
:meth:`Proposer.repeat_of` turns such a proposal into an unmeasured neighbour.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from orchestrator.config.schema import SAMPLERS
from orchestrator.planning.costmodel import (
    LINKS,
    Link,
    ModelSize,
    compute_s_per_sample,
    rank_candidates,
)
from orchestrator.search.study import NOT_RUN, queued_params
from search_spaces import PLAN_KNOBS, SearchContext, SearchSpace, SpaceError
from train_fns import metrics as m

MEMORY_PARAMS = (
    "strategy",
    "accumulation_steps",
    "activation_checkpointing",
    "reshard_after_forward",
)
COMM_ORDER = (
    "bucket_cap_mb",
    "static_graph",
    "gradient_as_bucket_view",
    "NCCL_ALGO",
    "NCCL_PROTO",
    "NCCL_MIN_NCHANNELS",
    "NCCL_BUFFSIZE",
    "NCCL_NTHREADS",
    "NCCL_SOCKET_NTHREADS",
    "NCCL_NSOCKS_PERTHREAD",
)
"""Stage 2's knob order, most effect first: DDP bucketing decides how many messages there are
and how much overlaps; then which NCCL algorithm and protocol carry them, and how wide."""
STAGE1_SHARE = 0.4
"""Most of the budget stage 1 may take (baseline included)."""
STAGE3_SHARE = 0.25
"""Budget left to the sampler's joint refinement: stage 2 stops before it."""
MAX_SWEEP = 8
"""A knob with more values than this is swept on powers of two and its ends only."""
GRID_BATCH = 32
"""Grid points queued per refill: enough to keep parallel asks busy, cheap to look up."""
JUDGED = (m.COMPLETE, m.PRUNED, m.OOM)
"""Outcomes that say how a configuration does (a crash or a hang may be the node's)."""
NEIGHBOUR_OF = "neighbour_of"
"""User attribute of a configuration queued in place of a sampler's repeat: the trial whose
configuration was asked again (the early stop counts it as the sampler's)."""
PATIENCE_SHARE = 0.5
"""Stage 3 ends early once this share of its budget (at least one trial) in a row raised
nothing: a sampler whose last trials found nothing clearly better is unlikely to on the next
few, and every trial is a minute of somebody's cluster."""


def make_sampler(name: str, seed: int, trials: int) -> optuna.samplers.BaseSampler:
    """The sampler behind a strategy; grid points and seeds are enqueued, so a random sampler
    only fills in. ``constant_liar``: the live search asks several trials before telling any,
    and without it TPE would propose the same point to each."""
    if name not in SAMPLERS:
        raise ValueError(f"unknown search strategy {name!r}; use one of {SAMPLERS}")
    if name in ("tpe", "staged"):
        return optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=max(3, trials // 4), constant_liar=True
        )
    return optuna.samplers.RandomSampler(seed=seed)


def _key(optuna_params: dict[str, Any]) -> str:
    """Identity of a configuration; repr keeps ``True`` apart from ``1``."""
    return repr(sorted(optuna_params.items()))


def _counted(trials: list[FrozenTrial]) -> int:
    """Trials that count against the budget: run or running (an interrupted one runs again)."""
    return sum(
        t.state != TrialState.WAITING and t.user_attrs.get(m.STATE) not in NOT_RUN
        for t in trials
    )


def _thin(points: list[dict[str, Any]], knob: str) -> list[dict[str, Any]]:
    """Keep a long int range's powers of two and ends: a sweep stays short, and the
    throughput of thread and socket counts changes on a log scale."""
    if len(points) <= MAX_SWEEP:
        return points
    last = len(points) - 1

    def kept(i: int, value: Any) -> bool:
        is_pow2 = isinstance(value, int) and value > 0 and value & (value - 1) == 0
        return i in (0, last) or is_pow2

    return [p for i, p in enumerate(points) if kept(i, p.get(knob))]


class Proposer:
    """Queues the next candidates of a search strategy into an Optuna study."""

    def __init__(
        self,
        space: SearchSpace,
        strategy: str,
        budget: int,
        seeds: Sequence[dict[str, Any]] = (),
        early_stop: bool = False,
    ) -> None:
        if strategy not in SAMPLERS:
            raise ValueError(f"unknown search strategy {strategy!r}; use one of {SAMPLERS}")
        if budget < 1:
            raise ValueError(f"budget={budget} must be >= 1 (the baseline counts)")
        self.space, self.strategy, self.budget = space, strategy, budget
        self._baseline = space.baseline()
        self._seeds = [dict(s) for s in seeds] if strategy != "grid" else []
        names = space.param_names
        self._memory = [n for n in MEMORY_PARAMS if n in names]
        rest = [n for n in names if n not in MEMORY_PARAMS]
        self._knobs = [n for n in COMM_ORDER if n in rest]
        self._knobs += [n for n in rest if n not in COMM_ORDER]
        self._stage2_end = budget - round(STAGE3_SHARE * budget)
        stage3 = budget - self._stage2_end
        self.patience = max(1, math.ceil(PATIENCE_SHARE * stage3)) if early_stop else None
        """Stage 3's trials in a row that may raise nothing before it ends (None: never)."""
        self._grid: list[dict[str, Any]] | None = None
        self._stage1: list[dict[str, Any]] | None = None

    def refill(self, study: optuna.Study) -> int:
        """Called before every ``study.ask()``. When the study has no WAITING trial, enqueue
        the next candidates and return how many were enqueued (0: let the sampler choose)."""
        trials = study.get_trials(deepcopy=False)
        if any(t.state == TrialState.WAITING for t in trials):
            return 0
        seen = {_key(queued_params(t)) for t in trials}
        batch = self._next(trials, self._fresh_filter(seen))
        # Never queue past the budget: what is queued and never run would stay WAITING in the
        # study (optuna-dashboard shows it as pending work) after the search ends.
        batch = batch[: max(1, self.budget - _counted(trials))]
        for params in batch:
            study.enqueue_trial(self.space.optuna_params(params), skip_if_exists=True)
        return len(batch)

    def repeat_of(self, study: optuna.Study, trial: optuna.Trial) -> int | None:
        """The number of the trial, judged or running, whose configuration ``trial`` (just
        asked, its params suggested) repeats; an unmeasured configuration one knob away from it
        is then queued (marked :data:`NEIGHBOUR_OF`), so the next ask measures that instead (the
        caller tells ``trial`` as :data:`~orchestrator.search.study.REPEAT`, not run).

        None, nothing queued, when the configuration is new, when ``trial`` was enqueued (a
        seed, a stage's point, or a deliberate re-run: the baseline or an interrupted trial
        queued again by ``--resume``), or when every neighbour is known too: it runs again
        then, the one case where a configuration is measured twice."""
        key = _key(trial.params)
        trials = study.get_trials(deepcopy=False)
        if any(t.number == trial.number and "fixed_params" in t.system_attrs for t in trials):
            return None
        earlier = next((t.number for t in trials if t.number != trial.number
                        and _key(t.params) == key and _known(t)), None)  # fmt: skip
        if earlier is None:
            return None
        point = self.space.from_optuna_params(trial.params)
        fresh = self._fresh_filter({_key(queued_params(t)) for t in trials})
        near = fresh(q for n in self.space.param_names for q in self._one_knob(n, point))
        if not near:
            return None
        # Seeded by the trial's number: the same study state draws the same neighbour.
        choice = random.Random(trial.number).choice(near)
        study.enqueue_trial(self.space.optuna_params(choice), user_attrs={NEIGHBOUR_OF: earlier})
        return earlier

    def _one_knob(self, knob: str, point: dict[str, Any]) -> list[dict[str, Any]]:
        """``point`` with ``knob`` changed; none for a knob too large to list (a long int range
        a sampler may search but no grid can hold)."""
        try:
            return self.space.grid_slice([knob], point)
        except SpaceError:
            return []

    def settled(self, study: optuna.Study) -> str | None:
        """Why the search can end before its budget, or None. Staged only, once nothing is
        queued or running and nothing of the seeds, stage 1 or stage 2 is left to queue: when
        the sampler's last :attr:`patience` judged trials (stage 3's, the only ones nothing
        enqueued; complete, pruned or out of memory: a crash or a hang says nothing of the
        configuration) raised nothing above the best lower bound before them (a completed
        trial's throughput less its window spread). Recomputed from the study, so a resumed
        search agrees (a re-queued interrupted trial counts as enqueued: at most one more)."""
        if self.strategy != "staged" or self.patience is None:
            return None
        trials = study.get_trials(deepcopy=False)
        if any(t.state in (TrialState.WAITING, TrialState.RUNNING) for t in trials):
            return None
        if self._next(trials, self._fresh_filter({_key(queued_params(t)) for t in trials})):
            return None  # the seeds and the first two stages always run
        sampled = [t for t in trials if _sampled(t) and t.user_attrs.get(m.STATE) in JUDGED]
        if len(sampled) < self.patience:
            return None
        last = sampled[-self.patience :]
        before = [_lower_bound(t) for t in trials if t.number < last[0].number]
        floor = max((b for b in before if b is not None), default=None)
        if floor is None or any((_lower_bound(t) or 0.0) > floor for t in last):
            return None
        shown = ", ".join(str(t.number) for t in last)
        return (f"the sampler's last {len(last)} trial(s) ({shown}) raised nothing above the "
                f"best lower bound before them ({floor:.2f} samples/s: a throughput less its "
                "window spread); search.early_stop: false runs every trial")  # fmt: skip

    def _fresh_filter(self, seen: set[str]) -> Callable[[Iterable[dict]], list[dict]]:
        def fresh(points: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
            out, keys = [], set(seen)
            for p in points:
                key = _key(self.space.optuna_params(p))
                if key not in keys:
                    keys.add(key)
                    out.append(p)
            return out

        return fresh

    def _next(self, trials: list[FrozenTrial], fresh: Callable) -> list[dict[str, Any]]:
        if self.strategy == "grid":
            return fresh(self._grid_points())[:GRID_BATCH]
        seeds = fresh(self._seeds)
        if seeds or self.strategy != "staged":
            return seeds
        return self._staged(trials, fresh)

    def _grid_points(self) -> list[dict[str, Any]]:
        if self._grid is None:
            self._grid = self.space.grid()
        return self._grid

    def _staged(self, trials: list[FrozenTrial], fresh: Callable) -> list[dict[str, Any]]:
        stage1 = fresh(self._stage1_points())
        if stage1:
            return stage1
        room = self._stage2_end - _counted(trials)
        best = self._best(trials)
        if room <= 0 or best is None:
            return []  # stage 3 (or nothing completed yet): the sampler decides
        for knob in self._knobs:
            sweep = fresh(_thin(self.space.grid_slice([knob], best), knob))
            if sweep:
                return sweep[:room]
        return []  # a coordinate-wise optimum: stage 3 starts early

    def _stage1_points(self) -> list[dict[str, Any]]:
        """The baseline, then the memory shapes the cost model ranks first, then those
        closest to the defaults, up to :data:`STAGE1_SHARE` of the budget."""
        if self._stage1 is None:
            shapes = self.space.grid_slice(self._memory, self._baseline)
            rank = {}
            for i, seed in enumerate(self._seeds):
                rank.setdefault(self._shape(seed), i)
            defaults = self._defaults()

            def order(item: tuple[int, dict[str, Any]]) -> tuple[bool, int, int, int]:
                i, p = item
                changed = sum(p.get(n) not in (None, defaults.get(n)) for n in self._memory)
                shape = self._shape(p)
                return shape != self._shape(self._baseline), rank.get(shape, 1 << 30), changed, i

            ordered = [p for _, p in sorted(enumerate(shapes), key=order)]
            self._stage1 = ordered[: max(1, round(STAGE1_SHARE * self.budget))]
        return self._stage1

    def _shape(self, params: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(params.get(n) for n in self._memory)

    def _defaults(self) -> dict[str, Any]:
        """Each param's default, including those the baseline's strategy leaves inactive."""
        out: dict[str, Any] = {}
        for point in self.space.grid_slice(["strategy"], self._baseline):
            out = {**point, **out}
        return {**out, **self._baseline}

    def _best(self, trials: list[FrozenTrial]) -> dict[str, Any] | None:
        done = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None]
        if not done:
            return None
        best = max(done, key=lambda t: (t.value, -t.number))  # ties: the earliest
        return self.space.from_optuna_params(best.params)


def _sampled(trial: FrozenTrial) -> bool:
    """Whether the sampler chose ``trial``: asked of it, or the neighbour queued in place of
    one of its repeats (the sampler's choice, moved one knob)."""
    return "fixed_params" not in trial.system_attrs or NEIGHBOUR_OF in trial.user_attrs


def _known(trial: FrozenTrial) -> bool:
    """Whether measuring ``trial``'s configuration again would tell nothing new: it is being
    measured, or its outcome says how the configuration does (:data:`JUDGED`)."""
    if trial.state in (TrialState.RUNNING, TrialState.COMPLETE, TrialState.PRUNED):
        return True
    return trial.user_attrs.get(m.STATE) in JUDGED


def _lower_bound(trial: FrozenTrial) -> float | None:
    """A completed trial's throughput less its window spread (cv): what it surely reached."""
    if trial.state != TrialState.COMPLETE or trial.value is None:
        return None
    return trial.value * (1.0 - (trial.user_attrs.get(m.THROUGHPUT_CV) or 0.0))


def ranked_candidates(
    space: SearchSpace, model: ModelSize, link: Link, compute_s_per_sample: float
) -> list[tuple[float, dict[str, Any]]]:
    """What the search seeds from, ranked by predicted samples/s, best first: the space's
    distinct plan knobs (the baseline's among them) with NCCL variables at their defaults,
    which the model does not see. The dry run shows this same list."""
    ctx = space.context
    vary = [n for n in space.param_names if n in PLAN_KNOBS]
    return rank_candidates(space.grid_slice(vary), model, ctx.world_size, link,
                           compute_s_per_sample, global_batch=ctx.global_batch,
                           precision=ctx.precision)  # fmt: skip


def cost_model_seeds(
    space: SearchSpace,
    model: ModelSize,
    link: Link,
    compute_s_per_sample: float,
    count: int,
) -> list[dict[str, Any]]:
    """The ``count`` configurations of :func:`ranked_candidates` ranked best, baseline
    excluded (it runs first anyway). Candidates the model cannot tell apart (the same
    prediction, e.g. differing only in ``static_graph``) yield one seed: a second would
    test nothing the model knows."""
    baseline = space.optuna_params(space.baseline())
    seeds: list[dict[str, Any]] = []
    predictions: set[float] = set()
    for predicted, params in ranked_candidates(space, model, link, compute_s_per_sample):
        if len(seeds) >= count:
            break
        if space.optuna_params(params) != baseline and predicted not in predictions:
            predictions.add(predicted)
            seeds.append(params)
    return seeds


NOMINAL_TFLOPS = {True: 100.0, False: 0.05}
"""Achieved TFLOP/s per rank the seeds assume before anything is measured: a modern GPU, and
a CPU worker of this project's 2-core CI machine (bert-mini's measured baseline: 0.048)."""


def nominal_link(context: SearchContext) -> Link:
    """The link the seeds assume without a probe: gloo over loopback on CPU workers, NVLink
    within a GPU node, 100 Gb/s between nodes."""
    if not context.use_gpu:
        return LINKS["loopback_gloo"]
    return LINKS["net_100g" if context.num_nodes > 1 else "nvlink_a100"]


def seed_count(config: Any) -> int:
    """How many cost-model seeds a search of ``config`` starts from (a grid has none)."""
    search = config.search
    return 0 if search.sampler == "grid" else search.cost_model_seeds


def search_seeds(
    space: SearchSpace, model: ModelSize, seq_len: int, count: int, link: Link | None = None,
    tflops: float | None = None,
) -> list[dict[str, Any]]:
    """The seeds a live search starts from: :func:`cost_model_seeds` on ``link`` (a probe's,
    or :func:`nominal_link`) with compute at ``tflops`` (default :data:`NOMINAL_TFLOPS`)."""
    context = space.context
    per_sample_s = nominal_compute_s(context, model, seq_len, tflops)
    return cost_model_seeds(space, model, link or nominal_link(context), per_sample_s, count)


def nominal_compute_s(
    context: SearchContext, model: ModelSize, seq_len: int, tflops: float | None = None
) -> float:
    """Seconds of compute per sample the cost model assumes: at ``tflops`` per rank, else the
    search's nominal figure for its workers (:data:`NOMINAL_TFLOPS`)."""
    rate = tflops or NOMINAL_TFLOPS[context.use_gpu]
    return compute_s_per_sample(model.num_params, seq_len, rate)
