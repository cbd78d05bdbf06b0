"""In-memory snapshots between checkpoints (``train_fns.snapshots``), without Ray: a run that
restarts from the newest snapshot trains on exactly as the uninterrupted run did, on as many
ranks as before or fewer, with DDP and FSDP2. The keeper here keeps its snapshots in a folder
(the Ray actor's role, ``orchestrator.train.snapshots``, across spawned runs); the Ray path is
the slow twin test (``tests/ray/test_train.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _spawn import run_distributed
from _tiny import CPU, example_plan, tiny_plan

from train_fns import metrics as m
from train_fns import snapshots
from train_fns.plan import DDPOptions
from train_fns.restart import RunSpec
from train_fns.trainer import ElasticTrainer

STEPS = 6


class FolderKeeper:
    """``train_fns.snapshots.Keeper`` over a folder: one file per step, the newest is latest."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def ready(self) -> bool:
        return True

    def put(self, step: int, data: bytes) -> None:
        (self.folder / f"{step}.snapshot").write_bytes(data)

    def latest(self, than_step: int) -> tuple[int, bytes] | None:
        files = sorted(self.folder.glob("*.snapshot"), key=lambda f: int(f.stem))
        if not files or int(files[-1].stem) <= than_step:
            return None
        return int(files[-1].stem), files[-1].read_bytes()


def spec(kind: str) -> dict:
    """6 steps, a checkpoint only at the end, a snapshot every 2 steps (at 2 and 4); ``moe``:
    a model whose steps leave experts without a gradient (so without optimizer state)."""
    run = {"warmup_steps": 0, "measure_steps": STEPS, "num_windows": 1, "max_grad_norm": 1.0}
    if kind == "moe":
        plan = example_plan("moe_workload", {"width": 16, "experts": 16}, 2, 1,
                            ddp=DDPOptions(find_unused_parameters=True), unused_parameters=True,
                            **run)  # fmt: skip
    else:
        plan = tiny_plan(strategy=kind, accumulation_steps=2, micro_batch=2, **run)
    return RunSpec(
        plan=plan.to_dict(), steps=STEPS, checkpoint_every=STEPS, max_micro_batch=plan.micro_batch,
        reference_every=2, grad_norm_every=2, snapshot_every=2,
    ).to_dict()  # fmt: skip


def _train(rank: int, world: int, spec_dict: dict, folder: str | None, busy: bool = False) -> list:
    """The run's rows, its snapshots kept in ``folder`` (None: no keeper; ``busy``: a keeper
    whose previous snapshot never arrives)."""
    reports: list[dict] = []
    keeper = None if folder is None else (Busy if busy else FolderKeeper)(folder)
    report = lambda batch, _: reports.extend(batch[m.ROWS])  # noqa: E731
    ElasticTrainer(RunSpec(**spec_dict), rank, world, CPU, report, None, keeper=keeper).run()
    return reports


@pytest.mark.parametrize(("kind", "worlds"), [("fsdp", (2, 1)), ("moe", (1,))])
def test_a_restart_from_the_newest_snapshot_trains_on_exactly(
    kind: str, worlds: tuple[int, ...], tmp_path: Path
) -> None:
    """Restarted on 1 rank (a node lost) and, for FSDP2, on 2 again (resharded both ways);
    ``moe`` is DDP (with find_unused_parameters) over a model whose experts go unused."""
    full = spec(kind)
    whole = run_distributed(_train, full, str(tmp_path))[0]
    assert [r.get(m.SNAPSHOT_S) is not None for r in whole] == [0, 1, 0, 1, 0, 0]
    assert sorted(f.name for f in tmp_path.iterdir()) == ["2.snapshot", "4.snapshot"]
    losses = {r[m.STEP]: r[m.LOSS] for r in whole}
    for world in worlds:
        after = run_distributed(_train, full, str(tmp_path), world_size=world)[0]
        start = after[0][m.EVENTS][0]
        assert (start["resumed_from"], start["resumed_from_step"]) == ("snapshot", 4), start
        assert [r[m.STEP] for r in after] == [5, 6]
        assert after[-1][m.SAMPLES_SEEN] == STEPS * whole[0][m.GLOBAL_BATCH]
        for row in after:
            assert row[m.LOSS] == pytest.approx(losses[row[m.STEP]], rel=1e-4), (world, row[m.STEP])


def test_a_snapshot_no_newer_than_the_checkpoint_is_not_used(tmp_path) -> None:  # noqa: ANN001
    """Rank 0 asks; one rank (no side group) has nothing to broadcast."""
    keeper = FolderKeeper(str(tmp_path))
    keeper.put(4, _bytes({"step": 4}))
    assert snapshots.newer(keeper, 0, than_step=4) == (None, True)
    found, usable = snapshots.newer(keeper, 0, than_step=3)
    assert found.state == {"step": 4} and found.stateful == ["a", "b"] and usable
    assert found.tensors["model"] == {}
    assert snapshots.newer(None, 0, than_step=0) == (None, False)
    assert snapshots.newer(Unreachable(), 0, than_step=0) == (None, False)  # this start: none


class Unreachable(FolderKeeper):
    def __init__(self) -> None:
        pass

    def latest(self, than_step: int) -> tuple[int, bytes] | None:
        raise snapshots.KeeperUnreachable("the keeper did not answer (GetTimeoutError)")


def test_the_keeper_ignores_a_put_from_a_group_that_has_since_restarted() -> None:
    from orchestrator.train.snapshots import SnapshotKeeper

    keeper = SnapshotKeeper()
    first, found = keeper.resume(0)
    assert found is None
    keeper.put(first, 10, b"ten")
    second, found = keeper.resume(5)  # the group restarts; a checkpoint at 5
    assert found == (10, b"ten")
    keeper.put(first, 15, b"late")  # still on its way from the first group: ignored
    keeper.put(second, 12, b"twelve")
    assert keeper.resume(10)[1] == (12, b"twelve")
    assert keeper.resume(12)[1] is None  # the checkpoint is as new: its bytes are not sent


def _bytes(state: dict) -> bytes:
    import io

    import torch

    buffer = io.BytesIO()
    torch.save({"model": {}, "optim": {"state": {"b": {}, "a": {}}}, "state": state}, buffer)
    return buffer.getvalue()


def test_no_keeper_no_snapshot_and_a_busy_one_holds_them_back(tmp_path) -> None:  # noqa: ANN001
    """Without a keeper (a run with snapshots off) the spec's interval is not acted on; while
    the previous snapshot is still on its way, rank 0 sends none (the step is not held)."""
    rows = run_distributed(_train, spec("ddp"), None, world_size=1)[0]
    assert all(r.get(m.SNAPSHOT_S) is None for r in rows)
    assert rows[0][m.EVENTS][0]["snapshot_every"] == 0
    busy = run_distributed(_train, spec("ddp"), str(tmp_path), True, world_size=1)[0]
    assert [bool(r.get(m.SNAPSHOT_HELD_BACK)) for r in busy] == [0, 1, 0, 1, 0, 0]
    assert all(r.get(m.SNAPSHOT_S) is None for r in busy) and not list(tmp_path.iterdir())


class Busy(FolderKeeper):
    """A keeper whose previous snapshot never arrives."""

    def ready(self) -> bool:
        return False
