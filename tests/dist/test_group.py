"""Warm evaluation (``evaluate_plans``) on two gloo ranks: configurations share the processes
and the process group, and nothing else."""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Iterator

import pytest
import torch
from _spawn import run_distributed
from _tiny import CPU, tiny_plan

from orchestrator.search.outcome import prune_threshold
from train_fns import metrics as m
from train_fns.group import END, START, evaluate_plans
from train_fns.plan import TrialPlan

MEASURE = {"warmup_steps": 1, "measure_steps": 4, "num_windows": 2}
SEQUENCE = {
    "ddp": tiny_plan(**MEASURE),
    "fsdp-accum2": tiny_plan(strategy="fsdp", accumulation_steps=2, **MEASURE),
    "ddp-again": tiny_plan(**MEASURE),
    "oom": tiny_plan(fault="oom", **MEASURE),
    "after-oom": tiny_plan(**MEASURE),
    "slower": tiny_plan(
        strategy="fsdp", accumulation_steps=4, warmup_steps=1, measure_steps=6, num_windows=3
    ),
}
""""slower" is held to the bound a search sets with "ddp" the best so far (``_bound``): FSDP
with four micro-steps measured 4 to 14 times slower than DDP with one on these CPU ranks."""
HELD = (list(SEQUENCE).index("slower"), list(SEQUENCE).index("ddp"))


def _throughputs(windows: list[dict], global_batch: int) -> list[float]:
    """Global samples/s of each window, from its slowest rank's step (the same on every rank)."""
    return [global_batch / w[m.GLOBAL_STEP_TIME_S] for w in windows]


def _bound(windows: list[dict], global_batch: int) -> float | None:
    """The throughput below which a configuration is clearly slower than the one measured in
    ``windows``: the search's bound (``prune_threshold``) at its noise floor, 15% under that
    configuration's slowest window. Not widened by the windows' spread as in a search: two
    short windows on a shared 2-core machine spread by its load (seen 2x apart, which widens
    the bound to 0). Every rank computes the same figure, so every rank prunes alike."""
    return prune_threshold(min(_throughputs(windows, global_batch)), None)


def _group_worker(
    rank: int, world_size: int, plans: list[dict], held: tuple[int, int] | None = None
) -> list[dict]:
    """The messages of ``plans`` measured in one group, then the live modules at each start.
    ``held``: (plan, baseline) indexes: that plan gets the ``_bound`` of the baseline's
    windows, measured earlier in the group, as a search sets one from the best so far."""
    sent: list[dict] = []
    live = []

    def plans_in_turn() -> Iterator[TrialPlan]:
        for index, data in enumerate(plans):
            plan = TrialPlan.from_dict(data)
            if held is not None and index == held[0]:
                base = next(s for s in sent if s["kind"] == END and s["index"] == held[1])
                plan = dataclasses.replace(
                    plan, prune_below=_bound(base["windows"], plan.global_batch)
                )
            yield plan

    queue = plans_in_turn()

    def send(message: dict) -> None:
        if message["kind"] == START:  # what the previous configurations left alive
            live.append(sum(isinstance(o, torch.nn.Module) for o in gc.get_objects()))
        sent.append(message)

    evaluate_plans(lambda: next(queue, None), rank, world_size, CPU, send)
    live.append(sum(isinstance(o, torch.nn.Module) for o in gc.get_objects()))
    sent.append({"kind": "live_modules", "counts": live})
    return sent


@pytest.fixture(scope="module")
def ends_by_rank() -> list[dict[str, dict]]:
    plans = [plan.to_dict() for plan in SEQUENCE.values()]
    sent = run_distributed(_group_worker, plans, HELD, timeout_s=180)
    starts = [msg["index"] for msg in sent[0] if msg["kind"] == START]
    assert starts == list(range(len(SEQUENCE)))  # rank 0 announces each configuration
    # every rank says it is ready for the first (the driver bounds the group's start by it)
    assert [msg["index"] for msg in sent[1] if msg["kind"] == START] == [0]
    # every model is freed before the next starts: as many live modules before each
    # configuration, and after the last, as before the first (library-owned ones)
    counts = sent[0][-1]["counts"]
    assert len(counts) == len(SEQUENCE) + 1 and len(set(counts)) == 1, counts
    names = list(SEQUENCE)
    return [{names[msg["index"]]: msg for msg in msgs if msg["kind"] == END} for msgs in sent]


def _losses(end: dict) -> list[float]:
    return [w[m.LOSS] for w in end["windows"]]


def test_no_state_leaks_between_configurations(ends_by_rank: list[dict[str, dict]]) -> None:
    """The same configuration before and after another one (FSDP, accumulation) and after an
    out-of-memory error trains identically: same initial weights, data, optimizer state."""
    for ends in ends_by_rank:
        assert ends["fsdp-accum2"]["status"] == m.COMPLETE
        first = _losses(ends["ddp"])
        assert len(first) == 2
        assert _losses(ends["ddp-again"]) == first
        assert _losses(ends["after-oom"]) == first


def test_out_of_memory_is_recorded_and_the_group_goes_on(
    ends_by_rank: list[dict[str, dict]],
) -> None:
    for ends in ends_by_rank:
        assert ends["oom"]["status"] == m.OOM
        assert "out of memory" in ends["oom"]["reason"]
        assert ends["oom"]["windows"] == []
        assert ends["after-oom"]["status"] == m.COMPLETE


def test_a_clearly_slower_configuration_stops_after_two_windows(
    ends_by_rank: list[dict[str, dict]],
) -> None:
    """Held to a bound measured from a faster configuration's windows (not one that no
    configuration reaches), a clearly slower one stops after two of its three windows, both
    below it."""
    for ends in ends_by_rank:
        global_batch = SEQUENCE["slower"].global_batch
        bound = _bound(ends["ddp"]["windows"], global_batch)
        figures = _throughputs(ends["slower"]["windows"], global_batch)
        assert ends["slower"]["status"] == m.PRUNED, (figures, bound)
        assert bound is not None and len(figures) == 2 and max(figures) < bound, (figures, bound)


def test_every_configuration_says_which_process_measured_it(
    ends_by_rank: list[dict[str, dict]],
) -> None:
    """A group's configurations run in its worker processes, one per rank (what warm
    evaluation saves is their start); each end message names the process, so that the driver
    can tell a reused group from a fresh one."""
    pids = [{end["pid"] for end in ends.values()} for ends in ends_by_rank]
    assert [len(p) for p in pids] == [1, 1] and pids[0] != pids[1], pids


def test_every_window_carries_its_measured_wall_clock(ends_by_rank: list[dict[str, dict]]) -> None:
    """A window's wall-clock holds at least its median step; its global step time is the
    slowest rank's (a synchronous step waits for it), the same on every rank."""
    by_window = zip(*(ends["ddp"]["windows"] for ends in ends_by_rank), strict=True)
    for ranks in by_window:
        slowest = max(w[m.STEP_TIME_S] for w in ranks)
        for window in ranks:
            assert window[m.WINDOW_WALL_S] >= window[m.STEP_TIME_S] > 0
            assert window[m.GLOBAL_STEP_TIME_S] == pytest.approx(slowest)


def _groups_per_plan(rank: int, world_size: int, plans: list[dict]) -> list[int]:
    """The live process groups at the end of each plan, on 4 ranks posing as 2 nodes."""
    import os

    from train_fns.group import live_groups

    os.environ["LOCAL_WORLD_SIZE"], os.environ["LOCAL_RANK"] = "2", str(rank % 2)
    queue = iter([TrialPlan.from_dict(p) for p in plans])
    counts: list[int] = []

    def send(message: dict) -> None:
        if message["kind"] == END:
            counts.append(len(live_groups()))

    evaluate_plans(lambda: next(queue, None), rank, world_size, CPU, send)
    return counts


def test_a_plans_process_groups_do_not_outlive_it() -> None:
    """An integer reshard builds a mesh per fully_shard call and HSDP one per plan; on NCCL
    each is a communicator with its buffers. The count stays flat from plan to plan."""
    from train_fns.plan import FSDPOptions

    steps = {"warmup_steps": 1, "measure_steps": 1, "num_windows": 1, "world_size": 4}
    reshard = tiny_plan(strategy="fsdp", fsdp=FSDPOptions(reshard_after_forward=2), **steps)
    hsdp = tiny_plan(strategy="fsdp", fsdp=FSDPOptions(hsdp=True), **steps)
    plans = [p.to_dict() for p in (tiny_plan(**steps), reshard, hsdp, reshard, tiny_plan(**steps))]
    counts = run_distributed(_groups_per_plan, plans, world_size=4, timeout_s=300.0)[0]
    assert len(counts) == len(plans) and len(set(counts)) == 1, counts


def _side_groups(rank: int, world_size: int) -> bool:
    from train_fns.group import live_groups
    from train_fns.ranks import reduce_over_ranks, side_group

    first = side_group()
    before = live_groups()
    for _ in range(3):
        reduce_over_ranks([1.0], op="max")
    return side_group() is first and live_groups() == before


def test_the_side_group_is_made_once_per_process_group() -> None:
    """Its cache compared the wrong thing and every figure made a new gloo group (8 per plan),
    which release_groups then destroyed: the group-count test stayed flat while each plan
    paid 0.08 s more."""
    assert all(run_distributed(_side_groups, timeout_s=60))


def test_resident_configurations_alternate_without_a_rebuild() -> None:
    """The verdict's paired windows: two configurations built once each, then measured in
    turns in the same processes (no rebuild, no guard), each going on from where it stopped,
    its window's first step the one after the switch (the race's: no unmeasured step); a plan
    without a key frees both, and nothing is left after it."""
    steps = {"warmup_steps": 1, "measure_steps": 2, "num_windows": 1}
    a = tiny_plan(resident="a", **steps)
    b = tiny_plan(strategy="fsdp", accumulation_steps=2, resident="b", **steps)
    again = [dataclasses.replace(p, warmup_steps=0) for p in (a, b, a)]
    plans = [p.to_dict() for p in (a, b, *again, tiny_plan(**steps))]
    sent = run_distributed(_group_worker, plans, timeout_s=180)
    for msgs in sent:
        ends = [msg for msg in msgs if msg["kind"] == END]
        assert [e["status"] for e in ends] == [m.COMPLETE] * len(plans)
        builds = [e["windows"][0][m.SETUP_S]["model_build_s"] for e in ends]
        assert builds[0] > 0 and builds[1] > 0 and builds[5] > 0, builds
        assert builds[2:5] == [0.0, 0.0, 0.0], builds
        assert [e["windows"][0][m.NUM_STEPS] for e in ends[2:5]] == [2, 2, 2]  # no stale step
        losses = [e["windows"][0][m.LOSS] for e in ends]
        assert losses[0] != losses[2] != losses[4]  # the same model, trained further
    counts = sent[0][-1]["counts"]  # live modules at each start, and after the last plan
    assert counts[2] > counts[0] and counts[-1] == counts[0], counts
