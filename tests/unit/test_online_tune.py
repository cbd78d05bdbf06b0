"""The tuning judge of ``orchestrator.train --tune`` (pure logic, no Ray): which split each
window trains with, what it keeps, what tuning cost, and what a ``--resume`` reads back."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from orchestrator.config.schema import ConfigError
from orchestrator.runfiles import TUNED_SIZES_YAML
from orchestrator.train.tune import (
    BUDGET_SPENT,
    FLOOR_WINDOWS,
    GUARD,
    WARMUP_WINDOWS,
    Judge,
    TuneSettings,
    check_budget,
)
from orchestrator.train.tune_files import read_tuned_sizes
from orchestrator.train.tune_knobs import bucket_candidates, candidates_of
from orchestrator.train.tune_lines import summary_lines, tune_line

SETTINGS = TuneSettings(window_steps=3, budget_steps=300, delta=0.02, max_pairs=8,
                        max_accumulation=8)  # fmt: skip


def drive(judge: Judge, speed: dict[int, float], noise: float, seed: int, world: int = 2,
          windows: int = 200) -> list[tuple[int, dict]]:  # fmt: skip
    """Feed the judge windows whose steps/s are ``speed[accumulation]`` times lognormal noise,
    until it is done; returns (accumulation run, answer after it) per window."""
    rng = random.Random(seed)
    answer = judge.begin(world, per_rank=16, running=split(1))
    seen = []
    for _ in range(windows):
        if answer["done"]:
            break
        accumulation = acc(answer)
        seconds = 3 / (speed[accumulation] * rng.lognormvariate(0, noise))
        answer = judge.window(world, seconds, 3)
        seen.append((accumulation, answer))
    return seen


def events(seen: list[tuple[int, dict]], kind: str) -> list[dict]:
    return [e for _, answer in seen for e in answer["events"] if e["kind"] == kind]


def split(accumulation: int) -> dict[str, float]:
    """A running setting of the accumulation split only (no DDP buckets to switch)."""
    return {"accumulation_steps": accumulation}


def acc(answer_or_event: dict, key: str = "setting") -> int:
    """The accumulation an answer's setting (or an event's candidate/running) holds."""
    return int(answer_or_event[key]["accumulation_steps"])


def test_candidates_are_smaller_micro_batches_that_split_the_batch() -> None:
    assert candidates_of(16, 1, 8) == [2, 4, 8]
    assert candidates_of(16, 4, 16) == [8, 16]
    assert candidates_of(12, 1, 8) == [2, 3, 4, 6]
    assert candidates_of(16, 8, 8) == []


def test_bucket_candidates_are_the_spaces_others_nearest_first() -> None:
    assert bucket_candidates(25.0, (1, 5, 10, 25, 50, None, 100, 200)) == [50, 10, 100, 5, 200, 1]
    assert bucket_candidates(1.0, (0.5, 2, 1, -3)) == [0.5, 2]  # as near: the smaller first


def test_a_faster_split_is_kept_and_written(tmp_path: Path) -> None:
    judge = Judge(SETTINGS, set(), {}, tmp_path)
    seen = drive(judge, {1: 10.0, 2: 10.5, 4: 12.0, 8: 9.0}, noise=0.01, seed=1)
    assert seen[-1][1]["done"] and acc(seen[-1][1]) == 4
    first = WARMUP_WINDOWS + FLOOR_WINDOWS
    assert {a for a, _ in seen[:first]} == {1}  # warm-up and floor on the running split
    decisions = {acc(e, "candidate"): e["outcome"] for e in events(seen, "tune_decision")}
    assert decisions[4] == "keep" and decisions[8] in ("slower", "no gain")
    assert read_tuned_sizes(tmp_path, 32)[2]["tuned"] == {"accumulation_steps": 4}
    summary = judge.summary()
    assert acc(summary["sizes"]["2"], "running") == 4
    assert summary["lost"]["steps"] > 0 and summary["lost"]["extra_s"] > 0  # 8 was slower
    assert "accumulation 4" in summary_lines(summary)[0]


def test_equal_splits_are_never_kept() -> None:
    """The A/A case in simulation: candidates exactly as fast, windows scattering 3%."""
    keeps = 0
    for seed in range(20):
        judge = Judge(SETTINGS, set(), {}, None)
        seen = drive(judge, dict.fromkeys((1, 2, 4, 8), 10.0), noise=0.03, seed=seed)
        keeps += sum(e["outcome"] == "keep" for e in events(seen, "tune_decision"))
    assert keeps <= 1


def test_a_slower_split_leaves_after_the_least_pairs() -> None:
    judge = Judge(SETTINGS, set(), {}, None)
    seen = drive(judge, {1: 10.0, 2: 7.0, 4: 7.0, 8: 7.0}, noise=0.01, seed=2)
    decisions = events(seen, "tune_decision")
    assert [d["outcome"] for d in decisions] == ["slower"] * 3
    assert all(d["pairs"] == 3 and d["steps"] == 12 for d in decisions)  # a settling window too
    assert acc(seen[-1][1]) == 1


def test_the_budget_ends_tuning_and_counts_the_candidate_cut_short() -> None:
    settings = TuneSettings(window_steps=3, budget_steps=12, delta=0.02, max_pairs=8,
                            max_accumulation=8)  # fmt: skip
    judge = Judge(settings, set(), {}, None)
    seen = drive(judge, dict.fromkeys((1, 2, 4, 8), 10.0), noise=0.03, seed=3)
    done = events(seen, "tune_done")[0]
    assert done["outcome"] == BUDGET_SPENT and acc(done, "running") == 1
    assert judge.summary()["sizes"]["2"]["spent"]["steps"] + done["lost"]["steps"] <= 2 * 12
    assert sum(a != 1 for a, _ in seen) * 3 <= 12


def test_a_restart_drops_the_pairs_in_flight_and_keeps_what_was_judged() -> None:
    judge = Judge(SETTINGS, set(), {}, None)
    speed = {1: 10.0, 2: 7.0, 4: 12.0, 8: 7.0}
    rng = random.Random(4)
    answer = judge.begin(2, 16, split(1))
    while not any(e["kind"] == "tune_decision" for e in answer["events"]):
        a = acc(answer)
        answer = judge.window(2, 3 / (speed[a] * rng.lognormvariate(0, 0.01)), 3)
    for _ in range(3):  # into accumulation 4's settling window and first pair
        a = acc(answer)
        answer = judge.window(2, 3 / (speed[a] * rng.lognormvariate(0, 0.01)), 3)
    again = judge.begin(2, 16, split(1))  # the group restarted while 4 raced
    assert acc(again) == 1 and not again["done"]
    cut, start = again["events"]
    assert (acc(cut, "candidate"), cut["outcome"], cut["steps"]) == (4, "interrupted", 6)
    assert start["candidates"] == [split(8)]  # 2 judged, 4 cut short: neither raced again
    assert acc(judge.window(2, 0.3, 3)) == 1  # warm-up again
    spent = judge.summary()["sizes"]["2"]
    assert spent["spent"]["steps"] == 12 + 6 and spent["lost"]["steps"] == 12 + 6


def test_decided_and_fixed_sizes_are_not_tuned(tmp_path: Path) -> None:
    prior = {1: {"tuned": {"accumulation_steps": 4}, "env": {}, "verdict": "online: ..."},
             4: {"tuned": {"accumulation_steps": 1}, "env": {}, "verdict": "online: ..."}}
    judge = Judge(SETTINGS, {4}, prior, tmp_path)  # the config's entry for 4 wins
    skipped = judge.begin(1, 32, split(2))
    assert acc(skipped) == 4 and skipped["done"]
    assert tune_line({**skipped["events"][0], "step": 0}).endswith(
        "accumulation 4 decided by tuned_sizes.yaml's entry: not tuned"
    )
    fixed = judge.begin(4, 8, split(2))
    assert fixed["done"] and acc(fixed) == 2
    assert "decided by the config's entry" in tune_line({**fixed["events"][0], "step": 0})
    drive(judge, {1: 10.0, 2: 12.0, 4: 8.0, 8: 8.0}, noise=0.01, seed=5)
    written = read_tuned_sizes(tmp_path, 32)
    assert written[1] == prior[1] and written[2]["tuned"]["accumulation_steps"] == 2
    assert written[2]["verdict"].startswith("online: accumulation 2 kept at ")
    assert written[2]["verdict"].endswith("x accumulation 1 (every candidate judged; "
                                          "3 candidate(s) judged)")  # fmt: skip


def test_a_decided_split_larger_than_the_start_allows_is_tuned_again() -> None:
    prior = {2: {"tuned": {"accumulation_steps": 1}, "env": {}, "verdict": "hand edit"}}
    answer = Judge(SETTINGS, set(), prior, None).begin(2, 16, split(2))  # micro-batch 16 > 8
    assert not answer["done"] and answer["events"][0]["kind"] == "tune_start"


@pytest.mark.parametrize(
    "text",
    ["sizes: {3: {tuned: {accumulation_steps: 2}}}",  # 3 workers cannot carry 32
     "sizes: {2: {tuned: {accumulation_steps: 3}}}",  # 16 a rank does not split 3 ways
     "sizes: {2: {tuned: {accumulation_steps: true}}}",
     "sizes: {2: {tuned: {accumulation_steps: 2, bucket_cap_mb: -1}}}",
     "sizes: {2: {tuned: {accumulation_steps: 2, bucket_cap_mb: .inf}}}",
     "sizes: {2: {tuned: {accumulation_steps: 2, bucket_cap_mb: '25'}}}",
     "sizes: {2: oops}", "sizes: [1, 2]", "- not a mapping", "sizes: 0", "sizes: {'2': {}}",
     "sizes: {? [1, 2] : {}}", "sizes: {2: {}, 2: {}}", "sizes: {0: {}}", "sizes: {64: {}}",
     "sizes: {2: {tuned: {accumulation_steps: 2}}}\nsizes: {}", "sizes: " + "[" * 40],
)  # fmt: skip
def test_a_broken_tuned_sizes_file_is_named(tmp_path: Path, text: str) -> None:
    (tmp_path / TUNED_SIZES_YAML).write_text(text)
    with pytest.raises(ConfigError, match="tuned_sizes.yaml") as e:
        read_tuned_sizes(tmp_path, 32)
    assert "remove" in str(e.value)


def test_every_event_has_a_line() -> None:
    judge = Judge(SETTINGS, set(), {}, None)
    seen = drive(judge, {1: 10.0, 2: 12.0, 4: 8.0, 8: 8.0}, noise=0.01, seed=6)
    kinds = set()
    for _, answer in seen:
        for event in answer["events"]:
            kinds.add(event["kind"])
            assert tune_line({**event, "step": 9}).startswith("tune: step 9, 2 worker(s): ")
    assert kinds == {"tune_pair", "tune_decision", "tune_done"}
    first = next(e for _, a in seen for e in a["events"] if e["kind"] == "tune_pair")
    assert "interval" not in tune_line({**first, "step": 1})  # one pair has none
    off = tune_line({"kind": "tune_off", "world": 2, "step": 4, "why": "GetTimeoutError: x"})
    assert off == "tune: step 4, 2 worker(s): tuning off: GetTimeoutError: x"


def test_a_budget_too_small_to_judge_a_candidate_is_named() -> None:
    from orchestrator import load_config

    config = load_config(None, "smoke", ["train.tune=online", "train.tune_budget=0.05"])
    with pytest.raises(ConfigError, match="train.tune_budget") as e:
        check_budget(config)
    assert "0.05 x train.steps=100 is 5 steps" in str(e.value) and "at least 12" in str(e.value)
    check_budget(load_config(None, "smoke", ["train.tune=online"]))  # 30 steps: room


def test_tune_and_adaptive_are_one_or_the_other() -> None:
    from orchestrator import load_config

    with pytest.raises(ConfigError, match=r"train.tune: online and train.adaptive both") as e:
        load_config(None, "smoke", ["train.tune=online", "train.adaptive=true"])
    assert "keep one" in str(e.value)


@pytest.mark.parametrize(
    ("value", "message"),
    [("onlin", "got 'onlin'; use one of: off, online"), ("3", "expected str, got 3")],
)  # fmt: skip
def test_a_mistyped_tune_mode_is_named(value: str, message: str) -> None:
    from orchestrator import load_config

    with pytest.raises(ConfigError, match="train.tune") as e:
        load_config(None, "smoke", [f"train.tune={value}"])
    assert message in str(e.value)


def test_the_flag_sets_online_tuning() -> None:
    from orchestrator.train.cli import check

    assert check(["--preset", "smoke", "--tune"]).train.tune == "online"
    assert check(["--preset", "smoke", "--set", "train.tune='off'"]).train.tune == "off"
    assert check(["--preset", "smoke", "--set", "train.tune=off"]).train.tune == "off"  # YAML's
    assert check(["--preset", "smoke", "--set", "train.tune=on"]).train.tune == "online"


def test_the_report_shows_what_tuning_kept_and_cost() -> None:
    from orchestrator.report.by_size import section_by_size
    from orchestrator.runfiles import RunRecord, Summary

    judge = Judge(SETTINGS, set(), {}, None)
    drive(judge, {1: 10.0, 2: 10.5, 4: 12.0, 8: 9.0}, noise=0.01, seed=1)
    progress = [{"step": "1", "samples_per_s": "20", "world_size": "2"}]
    text = section_by_size(RunRecord(summary=Summary(tune=judge.summary()), progress=progress))
    assert "Tuning while training (--tune)" in text
    assert "<td>2</td><td>accumulation 4</td><td>every candidate judged</td>" in text
    assert "accumulation 4: keep " in text
    assert "accumulation 8: slower " in text or "accumulation 8: no gain " in text
    hostile = {"sizes": {"2": {"running": "x", "decisions": [7, {"ratio": "y"}], "lost": 3},
                         "<b>": None}}  # fmt: skip
    text = section_by_size(RunRecord(summary=Summary(tune=hostile), progress=progress))
    assert "&lt;b&gt;" in text and "<b>" not in text  # shown, escaped, never a crash


def test_a_size_with_nothing_to_race_is_not_tuned_and_writes_no_entry(tmp_path: Path) -> None:
    judge = Judge(SETTINGS, set(), {}, tmp_path)
    answer = judge.begin(2, 16, split(8))  # 16 per rank: 16 would pass max_accumulation 8
    assert answer["done"] and acc(answer) == 8
    assert "no candidate" in tune_line({**answer["events"][0], "step": 0})
    assert not (tmp_path / "tuned_sizes.yaml").exists()


def test_a_disturbed_pair_is_no_evidence() -> None:
    """Three pairs, one whose running-split window ran far below the floor's speed: two clean
    pairs decide nothing (the search's race counts clean pairs too)."""
    judge = Judge(SETTINGS, set(), {}, None)
    judge.begin(2, 16, split(1))
    for _ in range(WARMUP_WINDOWS + FLOOR_WINDOWS):
        judge.window(2, 3.0, 3)  # 1 step/s
    judge.window(2, 3.0, 3)  # accumulation 2's settling window
    seen = []
    for seconds in (3.0, 3.1, 3.1, 3.0, 5.0, 3.9):  # B c, c B, B (slow: 0.6 step/s) c
        seen += judge.window(2, seconds, 3)["events"]
    pairs = [e for e in seen if e["kind"] == "tune_pair"]
    assert len(pairs) == 3 and not [e for e in seen if e["kind"] == "tune_decision"]


def test_a_judge_gone_mid_candidate_leaves_the_run_on_its_running_split() -> None:
    import dataclasses

    import torch

    from train_fns.online import OnlineTuning
    from train_fns.plan import TrialPlan

    class Gone(Judge):
        def window(self, world: int, seconds: float, steps: int) -> dict:
            if self.sizes[world].now == "finalist":
                raise TimeoutError("the judge did not answer")
            return super().window(world, seconds, steps)

    cpu = torch.device("cpu")
    plan = TrialPlan(model="bert-tiny", task="mlm", seq_len=16, global_batch=16, world_size=1,
                     accumulation_steps=1, micro_batch=16)  # fmt: skip
    runner = dataclasses.make_dataclass("R", ["plan", "device", "model"])(plan, cpu, None)
    tuning = OnlineTuning(Gone(SETTINGS, set(), {}, None), 1, window_steps=1)
    tuning.begin(runner, 0, 0)
    for step in range(WARMUP_WINDOWS + FLOOR_WINDOWS):
        tuning.start_step(cpu, False)
        tuning.after_step(runner, step + 1, 0)
    assert runner.plan.accumulation_steps == 2  # the candidate's settling window is next
    tuning.start_step(cpu, False)
    tuning.after_step(runner, 99, 0)
    assert tuning.done and runner.plan.accumulation_steps == 1
    assert tuning.take_events()[-1]["kind"] == "tune_off"


BUCKETS = TuneSettings(window_steps=3, budget_steps=300, delta=0.02, max_pairs=8,
                       max_accumulation=1, bucket_choices=(1, 5, 10, 25, 50, 100, 200))  # fmt: skip


def drive_buckets(judge: Judge, speed: dict[float, float], gaps: dict[float, float],
                  seed: int) -> list[dict]:  # fmt: skip
    """Feed windows whose steps/s are ``speed[bucket MB]`` (1.0 where not named) with 1% noise,
    answering each check the judge asks for with ``gaps[bucket]`` (0 where not named); returns
    every answer."""
    rng = random.Random(seed)
    answers = [judge.begin(2, 16, {"accumulation_steps": 1, "bucket_cap_mb": 25.0})]
    while not answers[-1]["done"]:
        mb = answers[-1]["setting"]["bucket_cap_mb"]
        if answers[-1]["check"]:
            answers.append(judge.checked(2, gaps.get(mb, 0.0)))
            continue
        seconds = 3 / (speed.get(mb, 1.0) * rng.lognormvariate(0, 0.01))
        answers.append(judge.window(2, seconds, 3))
    return answers


def test_bucket_sizes_race_nearest_first_and_a_faster_one_is_kept(tmp_path: Path) -> None:
    judge = Judge(BUCKETS, set(), {}, tmp_path)
    answers = drive_buckets(judge, {50.0: 1.2, 100.0: 0.8}, {}, seed=7)
    start = answers[0]["events"][0]
    assert [c["bucket_cap_mb"] for c in start["candidates"]] == [50, 10, 100, 5, 200, 1]
    assert "candidates: buckets 50, 10, 100, 5, 200, 1 MB" in tune_line(
        {**start, "step": 0})
    assert answers[-1]["running"] == {"accumulation_steps": 1, "bucket_cap_mb": 50.0}
    assert read_tuned_sizes(tmp_path, 32)[2]["tuned"] == {"accumulation_steps": 1,
                                                         "bucket_cap_mb": 50.0}  # fmt: skip
    checks = [a["setting"]["bucket_cap_mb"] for a in answers if a["check"]]
    assert checks == [50, 10, 100, 5, 200, 1]  # each candidate's first switch, once
    resumed = Judge(BUCKETS, set(), read_tuned_sizes(tmp_path, 32), None)
    again = resumed.begin(2, 16, {"accumulation_steps": 1, "bucket_cap_mb": 25.0})
    assert again["done"] and again["setting"]["bucket_cap_mb"] == 50


def test_the_guard_refuses_a_bucket_size_that_changes_the_gradients() -> None:
    judge = Judge(BUCKETS, set(), {}, None)
    answers = drive_buckets(judge, {10.0: 1.5}, {10.0: 0.2, 100.0: float("nan")}, seed=8)
    decisions = [e for a in answers for e in a["events"] if e["kind"] == "tune_decision"]
    refused = {d["candidate"]["bucket_cap_mb"]: d for d in decisions if d["outcome"] == GUARD}
    assert set(refused) == {10.0, 100.0} and refused[10]["steps"] == 0  # not a step trained
    line = tune_line({**refused[10], "step": 5})
    assert line.endswith("refused by the guard: buckets 10 MB changes the gradients; 0 steps, 0.0s")
    checks = {e["candidate"]["bucket_cap_mb"]: tune_line({**e, "step": 5}) for a in answers
              for e in a["events"] if e["kind"] == "tune_check"}  # fmt: skip
    assert len(checks) == 6 and "buckets 10 MB gives gradients at 2.0e-01 (relative) from " \
        "accumulation 1, buckets 25 MB's, beyond the tolerance 0.001" in checks[10]  # fmt: skip
    assert "at not finite (relative)" in checks[100] and "0.0e+00" in checks[50]
    assert answers[-1]["running"]["bucket_cap_mb"] == 25  # 10 was fastest, and refused
    assert judge.entries()[2]["tuned"] == {"accumulation_steps": 1}  # buckets as the start had
    assert not judge.checked(2, 9.0)["events"]  # a check nobody asked for changes nothing


def test_buckets_are_not_raced_without_ddp_nor_the_split_under_static_graph() -> None:
    judge = Judge(BUCKETS, set(), {}, None)
    plain = judge.begin(2, 16, split(1))  # no bucket knob: max_accumulation 1 leaves nothing
    assert plain["done"] and "no candidate" in plain["events"][0]["why"]
    judge = Judge(SETTINGS, set(), {}, None)
    static = judge.begin(2, 16, split(1), split_fixed=True)
    assert static["done"] and acc(static) == 1
