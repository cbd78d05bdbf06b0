"""``orchestrator.train`` profiles one step in N, as the search does (``train_fns.timing``): a
profiled CUDA step waits for the device at every phase boundary, which holds the host back and
FSDP2's prefetch with it, so a training run that profiled every step trained slower than it
had to. The trainer now asks for a profiled step only every ``reference_every`` steps; the
other steps are timed by wall-clock alone and their phase columns in ``progress.csv`` are blank.

On CPU the timer measures phases whatever it is asked (a sync there is free), so what is
checked is what the trainer asks for and what its rows say."""

from __future__ import annotations

import dataclasses

from _spawn import run_distributed
from _tiny import CPU, tiny_plan

from train_fns import metrics as m
from train_fns.restart import RunSpec

PHASE_COLUMNS = (m.DATA_S, m.OPTIM_S, m.EXPOSED_COMM_S, m.COMPUTE_S)
STEPS, EVERY = 6, 3


def _rows_and_asks(rank: int, world: int, spec: dict) -> dict[str, list]:
    from train_fns.loop import StepRunner
    from train_fns.trainer import ElasticTrainer

    asked: list[tuple[int, bool]] = []
    run_step = StepRunner.run_step

    def recording(self: StepRunner, step: int, profiled: bool = True):  # noqa: ANN202
        asked.append((step, profiled))
        return run_step(self, step, profiled)

    StepRunner.run_step = recording  # type: ignore[method-assign]
    rows: list[dict] = []
    ElasticTrainer(RunSpec(**spec), rank, world, CPU, lambda b, d: rows.extend(b[m.ROWS]),
                   None).run()  # fmt: skip
    return {"rows": rows, "asked": asked}


def _spec(**plan_changes: object) -> dict:
    plan = tiny_plan(warmup_steps=0, measure_steps=STEPS, num_windows=1, **plan_changes)
    return RunSpec(
        plan=dataclasses.replace(plan, max_grad_norm=1.0).to_dict(), steps=STEPS,
        checkpoint_every=100, max_micro_batch=plan.micro_batch, reference_every=EVERY,
        grad_norm_every=2, report_every=2,
    ).to_dict()  # fmt: skip


def test_training_profiles_one_step_in_n_and_leaves_the_others_blank() -> None:
    for plan in ({}, {"accumulation_steps": 2, "micro_batch": 2}):
        for rank, seen in enumerate(run_distributed(_rows_and_asks, _spec(**plan))):
            profiled = {step for step, asked in seen["asked"] if asked}
            assert profiled == {0, 3}, f"rank {rank} {plan}: profiled steps {seen['asked']}"
            rows = {row[m.STEP]: row for row in seen["rows"]}
            assert sorted(rows) == list(range(1, STEPS + 1))
            for step, row in rows.items():
                assert row[m.STEP_TIME_S] > 0 and row[m.SAMPLES_PER_S] > 0  # every step timed
                phases = [row[key] for key in PHASE_COLUMNS]
                if step - 1 in profiled:
                    assert None not in phases and row[m.COMPUTE_S] > 0, (rank, plan, row)
                else:
                    assert phases == [None] * len(phases), (rank, plan, step, phases)
