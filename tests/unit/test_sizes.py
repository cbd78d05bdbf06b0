"""Tuned entries per world size: which one a size runs, what its layout cannot run, and the
checks of a hand-written ``sizes`` section and of an elastic range (pure; no Ray, no torch)."""

from __future__ import annotations

import pytest

from orchestrator.config.schema import ConfigError, load_config
from orchestrator.config.size_entries import fit_context, fit_range, run_entries
from train_fns.size_fit import Layout, apply_env, fit, nearest

GPU = {"global_batch": 48, "strategy": "fsdp", "use_gpu": True}
CPU = {"global_batch": 48, "strategy": "ddp", "use_gpu": False}


def test_a_size_runs_its_own_entry_else_the_nearest_the_smaller_of_two() -> None:
    entries = {1: {}, 4: {}, 8: {}}
    assert [nearest(entries, w) for w in (1, 2, 3, 4, 6, 7, 8, 16)] == [1, 1, 4, 4, 4, 8, 8, 8]


def test_its_own_entry_keeps_its_split_another_size_resplits_up_to_its_micro_batch() -> None:
    entries = {2: {"tuned": {"accumulation_steps": 2, "bucket_cap_mb": 1}}}  # micro 12
    own = fit(entries, Layout(2), CPU)
    assert own.split == (2, 12) and own.tuned["bucket_cap_mb"] == 1 and not own.dropped
    one = fit(entries, Layout(1), CPU)
    assert one.split == (4, 12) and one.size == 2
    assert fit(entries, Layout(5), CPU).split is None  # 48 over 5 ranks: no exact split


def test_hsdp_runs_on_even_nodes_and_is_dropped_on_one_or_uneven_ones() -> None:
    entries = {4: {"tuned": {"strategy": "fsdp", "hsdp": True}}}
    assert fit(entries, Layout(4, 2), GPU).tuned["hsdp"] is True
    for layout in (Layout(4, 1), Layout(4, 2, even=False), Layout(2, 2)):
        fitted = fit(entries, layout, GPU)
        assert "hsdp" not in fitted.tuned, layout
        assert [k for k, _, _ in fitted.dropped] == ["hsdp"]
        assert "several nodes" in fitted.dropped[0][2]


def test_an_integer_reshard_needs_a_divisor_below_the_world_size() -> None:
    entries = {4: {"tuned": {"strategy": "fsdp", "reshard_after_forward": 2}}}
    assert fit(entries, Layout(4), GPU).tuned["reshard_after_forward"] == 2
    odd = {6: {"tuned": {"strategy": "fsdp", "reshard_after_forward": 3}}}  # not a choice
    assert fit(odd, Layout(6), GPU).tuned["reshard_after_forward"] == 3
    assert "reshard_after_forward" not in fit(odd, Layout(4), GPU).tuned
    for world in (2, 3):
        fitted = fit(entries, Layout(world), GPU)
        assert "reshard_after_forward" not in fitted.tuned  # the plan's default: true
        assert f"this run has {world}" in fitted.line(world)


def test_multi_node_variables_are_dropped_on_one_node_and_inert_ones_kept() -> None:
    env = {"NCCL_SOCKET_NTHREADS": "4", "NCCL_NSOCKS_PERTHREAD": "2", "NCCL_ALGO": "allreduce:ring"}
    entries = {4: {"tuned": {"strategy": "fsdp"}, "env": env}}
    assert fit(entries, Layout(4, 2), GPU).env == env
    one_node = fit(entries, Layout(4, 1), GPU)
    assert one_node.env == {"NCCL_ALGO": "allreduce:ring"}
    assert {k for k, _, _ in one_node.dropped} == {"NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD"}
    on_gloo = fit(entries, Layout(2), {**GPU, "use_gpu": False})  # inert at every size there:
    assert on_gloo.env == env and not on_gloo.dropped  # not the resize's to drop
    nvls = {8: {"tuned": {"strategy": "fsdp"}, "env": {"NCCL_ALGO": "allreduce:nvlstree"}}}
    on_one = fit(nvls, Layout(8, 1), {**GPU, "nvswitch": True})  # 8 on 2 nodes run NVLSTree
    assert on_one.env == {} and "several nodes" in on_one.dropped[0][2]


def test_static_graph_is_dropped_where_the_new_split_accumulates() -> None:
    entries = {4: {"tuned": {"static_graph": True}}}  # micro 12 at 4 ranks, accumulation 1
    assert fit(entries, Layout(4), CPU).tuned["static_graph"] is True
    fitted = fit(entries, Layout(2), CPU)  # 24 per rank, micro at most 12: accumulation 2
    assert fitted.split == (2, 12) and "static_graph" not in fitted.tuned


def test_defaults_and_values_outside_the_spaces_words_are_kept() -> None:
    entries = {2: {"tuned": {"hsdp": False}, "env": {"NCCL_ALGO": "ring"}}}
    fitted = fit(entries, Layout(2), {**GPU, "strategy": "ddp"})
    assert fitted.tuned["hsdp"] is False and fitted.env == {"NCCL_ALGO": "ring"}
    assert not fitted.dropped


def _config(*sets: str):
    return load_config(preset="cpu-demo", sets=list(sets))


def test_a_hand_written_sizes_section_is_checked_key_by_key() -> None:
    good = _config("sizes={1: {tuned: {bucket_cap_mb: 4}, samples_per_s: 90.5}}")
    assert good.sizes == {1: {"tuned": {"bucket_cap_mb": 4}, "env": {}, "samples_per_s": 90.5}}
    bad = {
        "sizes={0: {tuned: {}}}": "sizes.0",
        "sizes={'²': {tuned: {}}}": "sizes.²",
        "sizes={1048576: {tuned: {}}}": "sizes.1048576",
        "sizes={1: {tuned: {bucket_cap: 4}}}": "sizes.1.tuned.bucket_cap",
        "sizes={1: {tunned: {}}}": "sizes.1.tunned",
        "sizes={1: {tuned: []}}": "sizes.1.tuned",
        "sizes={1: {env: 0}}": "sizes.1.env",
        "sizes={7: {tuned: {}}}": "sizes.7",
        "sizes={1: {env: {LD_PRELOAD: x.so}}}": "sizes.1.env",
        "sizes={1: {env: {GLOO_SOCKET_IFNAME: eth1}}}": "sizes.1.env.GLOO_SOCKET_IFNAME",
        "sizes={1: {tuned: {reshard_after_forward: 2}}}": "sizes.1.tuned.reshard_after_forward",
        "sizes={1: {tuned: {accumulation_steps: 3}}}": "sizes.1.tuned.accumulation_steps",
        "sizes={1: {tuned: {accumulation_steps: 2, static_graph: true}}}": "sizes.1.tuned.static",
        "sizes={1: {samples_per_s: -1}}": "sizes.1.samples_per_s",
        "sizes={1: {verdict: [1, 2]}}": "sizes.1.verdict",
        "sizes={1: {trial: -5}}": "sizes.1.trial",
        "sizes={2: {tuned: {bucket_cap_mb: 4}}}": "sizes.2",  # the top level's size, unlike it
    }
    for text, key in bad.items():
        with pytest.raises(ConfigError) as e:
            _config(text)
        assert e.value.key.startswith(key), (text, e.value)
    both = _config("sizes={1: {tuned: {bucket_cap_mb: 4}}}", "sizes.1.samples_per_s=80")
    assert both.sizes[1]["tuned"] == {"bucket_cap_mb": 4} and both.sizes[1]["samples_per_s"] == 80


def test_a_tuned_value_no_size_of_the_range_runs_is_refused_naming_it() -> None:
    config = _config("strategy=fsdp", "tuned={strategy: fsdp, reshard_after_forward: 2}",
                     "cluster.num_workers=4", "workload.global_batch=48")  # fmt: skip
    fitted = fit_range(config, False, range(2, 5), lambda w: Layout(w))
    assert [w for w, f in fitted.items() if f.dropped] == [2, 3]
    with pytest.raises(ConfigError) as e:
        fit_range(config, False, range(1, 4), lambda w: Layout(w))
    assert e.value.key == "tuned.reshard_after_forward" and "1:3" in str(e.value)
    assert fit_context(config, True)["use_gpu"] is True
    hsdp = _config("strategy=fsdp", "sizes={4: {tuned: {strategy: fsdp, hsdp: true}}}",
                   "cluster.num_workers=2", "workload.global_batch=48")  # fmt: skip
    assert fit_range(hsdp, True, range(2, 5), lambda w: Layout(w, 2))[4].tuned["hsdp"] is True
    with pytest.raises(ConfigError) as e:  # the range runs the entry for 4 on one node only
        fit_range(hsdp, True, range(2, 5), lambda w: Layout(w))
    assert e.value.key == "sizes.4.tuned.hsdp"


def test_an_entry_without_variables_keeps_the_fixed_ones() -> None:
    config = _config("env={NCCL_SOCKET_IFNAME: eth0}", "sizes={1: {tuned: {}}}")
    assert run_entries(config)[1]["env"] == {"NCCL_SOCKET_IFNAME": "eth0"}


def test_static_graph_is_dropped_however_many_steps_the_new_split_accumulates() -> None:
    entries = {64: {"tuned": {"static_graph": True}}}  # 64 ranks of 1; 2 ranks accumulate 32
    fitted = fit(entries, Layout(2), {**CPU, "global_batch": 64})
    assert fitted.split == (32, 1) and "static_graph" not in fitted.tuned


def test_tuned_split_plan_and_env_pick_the_entry_for_the_world_size() -> None:
    from train_fns import tuned

    best = {
        "workload": {"model": "bert-tiny", "global_batch": 48},
        "cluster": {"num_workers": 4},
        "tuned": {"strategy": "ddp", "accumulation_steps": 2, "bucket_cap_mb": 8},
        "env": {"NCCL_SOCKET_NTHREADS": 4},
        "sizes": {2: {"tuned": {"strategy": "ddp", "bucket_cap_mb": 2}, "env": {}}},
    }
    assert tuned.split(best, 4) == (6, 2) and tuned.plan_for(best, 4).ddp.bucket_cap_mb == 8
    assert tuned.split(best, 2) == (24, 1) and tuned.plan_for(best, 2).ddp.bucket_cap_mb == 2
    assert tuned.split(best, 3) == (16, 1) and tuned.fitted(best, 3).size == 2  # nearest: 2
    assert tuned.worker_env(best) == {"NCCL_SOCKET_NTHREADS": "4"}  # the top level, unchanged
    assert tuned.worker_env(best, 2, num_nodes=2) == {"NCCL_SOCKET_NTHREADS": "4"}  # inherited


def test_the_closing_line_of_a_size_reads_with_and_without_a_searched_figure() -> None:
    from orchestrator.train.cli import size_line

    plain = {"world_size": 2, "steps": 30, "samples_per_s": 210.0, "entry_size": 2}
    assert size_line(plain) == "  2 workers: 30 steps at 210.0 samples/s"
    searched = {**plain, "searched_samples_per_s": 250.0, "samples_per_s": None}
    assert size_line(searched).endswith("n/a samples/s (search measured 250.0 for the entry for 2)")


def test_a_resumed_run_rewrites_an_older_progress_csv_under_the_new_columns(tmp_path) -> None:
    import csv

    from orchestrator.train.runlog import PROGRESS_COLUMNS, RunLog

    older = PROGRESS_COLUMNS[:-2]  # written before the entry columns existed
    (tmp_path / "progress.csv").write_text(
        ",".join(older) + "\n" + "1,5" + "," * (len(older) - 2) + "\n"
    )
    RunLog(tmp_path, steps=10, log_every=5).close()
    rows = list(csv.DictReader((tmp_path / "progress.csv").open()))
    assert list(rows[0]) == list(PROGRESS_COLUMNS) and rows[0]["step"] == "5"
    assert rows[0]["entry_size"] == ""
    RunLog(tmp_path, steps=10, log_every=5).close()  # the same columns now: appended to, as is
    assert len(list(csv.DictReader((tmp_path / "progress.csv").open()))) == 1


def _trained(out, figures: dict[int, tuple[float, float]]) -> None:
    """A training run folder whose each world size ran its own entry: (trained, searched)."""
    from orchestrator.train.runlog import RunLog
    from train_fns import metrics as m

    log, step = RunLog(out, steps=4, log_every=100), 0
    for world, (trained, searched) in figures.items():
        start = {"kind": "start", "world_size": world, "accumulation_steps": 1,
                 "micro_batch": 8, "global_batch": 16, "entry_size": world,
                 "searched_samples_per_s": searched}  # fmt: skip
        rows = []
        for _ in range(2):
            step += 1
            rows.append({m.STEP: step, m.WORLD_SIZE: world, m.SAMPLES_PER_S: trained,
                         m.LOSS: 1.0, m.WALL_TIME: float(step)})  # fmt: skip
        rows[0][m.EVENTS] = [start]
        log.take({"report": {m.ROWS: rows}})
    log.summary(1.0, None)
    log.close()


def test_a_size_below_its_own_searched_figure_is_flagged_by_log_report_and_doctor(tmp_path) -> None:
    from orchestrator.findings.rules import rule_size_below_searched
    from orchestrator.report.by_size import section_by_size
    from orchestrator.runfiles import collect

    _trained(tmp_path / "ok", {2: (1480.0, 1490.0), 1: (760.0, 800.0)})
    record = collect([tmp_path / "ok"])
    assert record.summary.warnings == [] and rule_size_below_searched(record) is None
    assert "below" not in section_by_size(record) and "<td>95%</td>" in section_by_size(record)
    _trained(tmp_path / "low", {2: (1480.0, 1490.0), 1: (400.0, 800.0)})
    record = collect([tmp_path / "low"])
    assert record.summary.warnings[0].startswith("1 workers trained at 400.0 samples/s, 50%")
    assert "50% (below 80%)" in section_by_size(record)
    finding = rule_size_below_searched(record)
    assert finding is not None and finding.title.startswith("1 workers trained at 50%")


def test_hand_edited_per_size_figures_read_as_absent_not_as_a_crash() -> None:
    from orchestrator.findings.rules import rule_size_below_searched
    from orchestrator.report.by_size import section_by_size
    from orchestrator.runfiles import RunRecord, Summary, below_searched

    junk = [
        {"world_size": 2, "samples_per_s": "fast", "entry_size": 2, "searched_samples_per_s": 9},
        {"samples_per_s": 1.0, "searched_samples_per_s": 100.0},  # no sizes: not its own entry
        {"world_size": 1, "entry_size": 1, "samples_per_s": float("nan"),
         "searched_samples_per_s": 5.0},
        {"world_size": 4, "entry_size": 4, "samples_per_s": 1.0, "searched_samples_per_s": True},
    ]  # fmt: skip
    assert below_searched(junk) == []
    record = RunRecord(summary=Summary(by_size=junk))
    assert rule_size_below_searched(record) is None
    assert "nan" not in section_by_size(record)


def test_a_running_process_takes_only_nccls_own_variables_from_another_sizes_entry() -> None:
    """NCCL reads NCCL_* as it makes a communicator (after ``apply_env``); the allocator read
    PYTORCH_CUDA_ALLOC_CONF and the process group TORCH_NCCL_* as the process started: set
    later, they would be silently ignored, so they are dropped with the reason."""
    environ = {"PYTORCH_CUDA_ALLOC_CONF": "roundup_power2_divisions:4", "NCCL_PROTO": "Simple"}
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
           "TORCH_NCCL_AVOID_RECORD_STREAMS": "1", "NCCL_ALGO": "allreduce:ring"}  # fmt: skip
    fitted = fit({4: {"env": env}}, Layout(4), GPU)
    names = {"NCCL_PROTO", *env}
    applied = apply_env(environ, fitted, names)
    assert environ == {"PYTORCH_CUDA_ALLOC_CONF": "roundup_power2_divisions:4",
                       "NCCL_ALGO": "allreduce:ring"}  # fmt: skip
    assert applied.env == {"NCCL_ALGO": "allreduce:ring"}
    dropped = {key: why for key, _, why in applied.dropped}
    assert set(dropped) == {"PYTORCH_CUDA_ALLOC_CONF", "TORCH_NCCL_AVOID_RECORD_STREAMS"}
    assert all("read as the process starts" in why for why in dropped.values())
    same = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}  # what it started with
    assert apply_env(dict(same), fit({4: {"env": same}}, Layout(4), GPU), set(same)).env == same
