"""Trials: sampled params -> checked TrialPlan -> a real TorchTrainer run -> outcome.

``run_group`` is the Ray Tune function trainable: one Tune trial is one worker group that
measures one or more configurations (warm evaluation), each an Optuna trial of its own. It
never raises for an outcome it understands (infeasible, oom, hang, crash): it reports the
outcome with its reason, so that the search goes on and Optuna is told the truth.
"""

from __future__ import annotations

import dataclasses
import itertools
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from orchestrator.cluster.placement import group_nodes
from orchestrator.cluster.workers import say
from orchestrator.config.schema import Config
from orchestrator.planning.costmodel import comm_bound
from orchestrator.planning.from_config import plan_from_config
from orchestrator.search.correctness import guard_check
from orchestrator.search.group_run import START, GroupRun, slowest_start
from orchestrator.search.lease import ENV, LABEL, PLAN, RESULTS
from search_spaces import SearchSpace, is_env_name
from train_fns import metrics as m
from train_fns.hold import hold
from train_fns.plan import InfeasiblePlan, TrialPlan

TRIAL_NUMBER = "trial_number"
"""Config key carrying the Optuna trial number (what users see) into the trial."""
OUTCOME = "outcome"
"""Result key holding the trial's whole outcome record (state, reason, metrics, timings)."""
WORK = "work"
"""Config key of a Tune trial: the queue its configurations (``Member`` dicts) come from."""
NODES = "nodes"
"""Config key of a Tune trial: the node ids its workers must stay on (None: anywhere)."""
SLOWEST_START = "slowest_start_s"
"""Config key of a Tune trial: the slowest group start the search has seen (None: none)."""


@dataclass(frozen=True)
class TrialContext:
    """What every trial shares; shipped once with ``tune.with_parameters``."""

    config: Config
    space: SearchSpace
    use_gpu: bool
    storage_path: str
    task: str
    """mlm or clm, resolved once on the driver (a trial may run where a local model is not)."""
    faults: dict[int, str] = field(default_factory=dict)
    link: Any = None
    """The costmodel Link the probe measured (None: no probe): each trial's bound."""
    notices: Any = None
    """A queue on the driver for a trial's heartbeat lines (a trial's own prints do not reach
    the terminal); None: print them."""
    slowest_start_s: float | None = None
    """The slowest worker-group start seen so far (``group_run.bound_of``); None: none yet."""


def sampled_params(config: dict[str, Any], space: SearchSpace) -> dict[str, Any]:
    """The trial's params by their real names (no Optuna-internal or bookkeeping keys)."""
    names = {*space.param_names, "strategy"}
    return {k: v for k, v in config.items() if k in names}


def derive_plan(
    ctx: TrialContext, params: dict[str, Any], fault: str | None = None
) -> tuple[TrialPlan, dict[str, str]]:
    """Combine the fixed config with the sampled knobs; raise InfeasiblePlan if it cannot run."""
    cfg = ctx.config
    knobs = {**cfg.tuned, **ctx.space.knobs(params)}
    env = {**cfg.env, **ctx.space.env_vars(params)}
    plan = plan_from_config(
        cfg,
        ctx.task,
        ctx.use_gpu,
        knobs,
        cfg.cluster.num_workers,
        env,
        warmup_steps=cfg.search.warmup_steps,
        measure_steps=cfg.search.measure_steps,
        num_windows=cfg.search.windows,
        env_names=tuple(sorted(set(env) | set(filter(is_env_name, ctx.space.param_names)))),
        fault=fault,
    )
    return plan, env


@dataclass(frozen=True)
class Member:
    """One configuration of a group: its Optuna trial number and sampled params."""

    number: int
    params: dict[str, Any]
    prune_below: float | None = None
    reference: dict[str, Any] | None = None
    """The baseline's correctness figures (``train_fns.guard``); None: this is the baseline,
    or it has not completed yet (the configuration is then not checked)."""


@dataclass(frozen=True)
class Lent:
    """A plan the driver sends to a group lent to it (``search.lease``): measured as is, its
    outcome put in ``results``, not reported to Tune."""

    label: str
    results: Any


WORK_TIMEOUT_S = 3600.0
"""How long a group waits for the searcher's next configuration before it ends."""


def run_group(config: dict[str, Any], ctx: TrialContext) -> None:
    """Tune function trainable: one worker group measuring the configurations the searcher
    puts in ``config[WORK]`` (``Member`` dicts; None ends the group), reporting one result
    per configuration as each ends; the searcher answers each with the next one.

    Configurations the group did not reach (it crashed or hung on an earlier one) are not
    reported: the searcher re-queues them.
    """
    from ray import tune

    def report(member: Member, outcome: dict[str, Any]) -> None:
        outcome["params"] = sampled_params(member.params, ctx.space)
        # Tune insists that the objective is in every result; the rest travels as one record.
        tune.report(
            {
                m.SAMPLES_PER_S: outcome.get(m.SAMPLES_PER_S),
                TRIAL_NUMBER: member.number,
                OUTCOME: outcome,
            }
        )

    members: list[Member | Lent] = []  # the feasible ones, in the group's order
    try:
        out = ctx.notices.put if ctx.notices is not None else say
        ctx = dataclasses.replace(ctx, slowest_start_s=config.get(SLOWEST_START))
        run = GroupRun(ctx, f"group_{tune.get_context().get_trial_id()}", config.get(NODES), out)
        _measure(run, _members(config[WORK], ctx, report, members), members, ctx, report)
    except Exception as e:  # a driver-side bug must not kill the search; keep its trace
        victim = members[-1] if members else _unstarted(config[WORK])
        if isinstance(victim, Lent):
            return  # the driver's lease reads the group's end (``_measure``), not a report
        if victim is None:
            raise  # nothing was sent to it: Tune records the error and its traceback
        report(victim, {
            m.STATE: m.ERROR,
            m.REASON: f"trial driver failed: {type(e).__name__}: {e}",
            "traceback": traceback.format_exc(limit=8),
        })  # fmt: skip


def _unstarted(work: Any) -> Member | None:
    """The configuration the searcher sent to a group that failed before taking it."""
    from ray.util.queue import Empty

    try:
        data = work.get(block=False)
    except Empty:
        return None
    return None if data is None else Member(**data)


def _members(
    work: Any, ctx: TrialContext, report: Callable, taken: list[Member | Lent]
) -> Iterator[tuple[TrialPlan, dict[str, str]]]:
    """(plan, env) of each configuration the searcher sends, appended to ``taken``; infeasible
    ones are reported at once (and the searcher answers with the next). A lent plan (the
    driver's, whole) is measured as it comes."""
    while (data := work.get(timeout=WORK_TIMEOUT_S)) is not None:
        if PLAN in data:
            taken.append(Lent(data[LABEL], data[RESULTS]))
            yield TrialPlan.from_dict(data[PLAN]), data[ENV]
            continue
        member = Member(**data)
        try:
            plan, env = derive_plan(ctx, member.params, ctx.faults.get(member.number))
        except InfeasiblePlan as e:
            report(member, {m.STATE: m.INFEASIBLE, m.REASON: str(e), "trial_wall_s": 0.0})
            continue
        except Exception as e:  # a bug deriving this one plan: its own error, with the trace
            report(member, {
                m.STATE: m.ERROR,
                m.REASON: f"could not derive its plan: {type(e).__name__}: {e}",
                "traceback": traceback.format_exc(limit=8),
            })  # fmt: skip
            continue
        taken.append(member)
        hold(f"trial-{member.number}")  # a test's kill point; a no-op in real runs
        yield dataclasses.replace(plan, prune_below=member.prune_below), env


def _measure(
    run: Any, source: Iterator, members: list[Member | Lent], ctx: TrialContext,
    report: Callable,
) -> None:  # fmt: skip
    def emit(index: int, outcome: dict[str, Any]) -> None:
        if isinstance(members[index], Lent):
            members[index].results.put(outcome)
            return
        plan = run.plans[index]
        outcome["env"], outcome["plan"] = run.env, plan.to_dict()
        if run.nodes:
            outcome["nodes"] = run.nodes
        if outcome.get(m.STATE) == m.COMPLETE:
            outcome.update(comm_bound(plan, outcome.get(m.NUM_PARAMS, 0), ctx.link))
            why = guard_check(members[index].reference, outcome.get(m.GUARD), plan)
            if why:
                outcome.update({m.STATE: m.CORRUPT, m.REASON: why})
        report(members[index], outcome)

    def label(index: int) -> str:
        member = members[index]
        return member.label if isinstance(member, Lent) else f"trial {member.number}"

    try:
        run.run(source, emit, label=label)
    finally:
        lent = next((mm for mm in members if isinstance(mm, Lent)), None)
        if lent is not None:
            lent.results.put(None)  # the group ended: the lease's end


def measure_plans(
    ctx: TrialContext,
    items: list[tuple[TrialPlan, dict[str, str]]],
    name: str,
    on_outcome: Callable[[int, dict[str, Any]], None] | None = None,
    nodes: list[str] | None = None,
) -> list[dict[str, Any]]:
    """Measure plans outside the search (re-measurement, scaling), in order: consecutive plans
    with the same environment share a worker group. A group that overruns a bound or crashes
    is ended (its workers killed) and the plans it did not reach run in a fresh group, as the
    search re-queues them: a hung finalist must not cost the baseline run after it. One never
    reached (its group hung while it started, or reached none) is an ``error``.
    ``on_outcome(position, outcome)`` is called as each one ends. Every group runs on
    ``nodes`` (Ray node ids) when given, else on the nodes the first group ran on: the
    sequence compares measurements, so they must share machines."""
    outcomes: list[dict[str, Any] | None] = [None] * len(items)
    for _, run in itertools.groupby(range(len(items)), key=lambda i: items[i][1]):
        todo = list(run)
        while todo:

            def emit(k: int, outcome: dict[str, Any], todo: list[int] = todo) -> None:
                if on_outcome is not None:
                    on_outcome(todo[k], outcome)

            group = GroupRun(ctx, name=f"{name}_{todo[0]:02d}", nodes=nodes, owned=True)
            reached = group.run(iter([items[i] for i in todo]), emit)  # those it took, at most
            nodes = nodes or group_nodes(group.places.values()) or None
            seen = slowest_start(filter(None, reached), ctx.slowest_start_s)
            ctx = dataclasses.replace(ctx, slowest_start_s=seen)  # the next group's bound
            for i, outcome in zip(todo, reached, strict=False):
                outcomes[i] = outcome
            left = [i for i in todo if outcomes[i] is None]
            # a group that never started would not start for the rest of its environment
            started = not any((outcomes[i] or {}).get("phase") == START for i in todo)
            todo = left if started and len(left) < len(todo) else []
    return [o or {m.STATE: m.ERROR, m.REASON: "not reached: its group ended"} for o in outcomes]
