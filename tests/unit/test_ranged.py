"""A search over a range of world sizes, the parts without Ray: which sizes, each size's
config, and best.yaml's entry per size read from each size's own best.yaml."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config.schema import ConfigError, dump_config, load_config
from orchestrator.config.size_entries import sizes_to_tune, workers_range
from orchestrator.search.ranged import read_entry, size_config, write_sizes

HEADER = (
    "# commtune best configuration: trial 3, 210.50 samples/s\n"
    "# verdict, measured beside the baseline: keep trial 3: 1.12x baseline (interval 1.05-1.20"
    " from 6 window pairs); best.yaml keeps it\n"
)


def test_the_ends_and_the_powers_of_two_between_that_carry_the_batch_largest_first() -> None:
    assert sizes_to_tune(1, 2, 16) == [2, 1]
    assert sizes_to_tune(2, 8, 48) == [8, 4, 2]
    assert sizes_to_tune(3, 12, 48) == [12, 8, 4, 3]
    assert sizes_to_tune(5, 7, 48) == []  # none carries 48 exactly
    assert sizes_to_tune(4, 4, 48) == [4]


def test_a_single_n_is_exactly_n_workers() -> None:
    assert workers_range("2") == (2, 2) and workers_range(" 1:4 ") == (1, 4)


def test_world_sizes_are_checked_against_the_batch_and_the_primary_size() -> None:
    good = load_config(preset="cpu-demo", sets=["search.world_sizes=[2, 1]"])
    assert good.search.world_sizes == [2, 1]
    bad = {
        "search.world_sizes=[2, 7]": "search.world_sizes[1]",
        "search.world_sizes=[2, 2]": "search.world_sizes",
        "search.world_sizes=[4, 1]": "cluster.num_workers",
        "search.world_sizes=[0]": "search.world_sizes[0]",
    }
    for text, key in bad.items():
        with pytest.raises(ConfigError) as e:
            load_config(preset="cpu-demo", sets=[text])
        assert e.value.key == key, (text, e.value)


def test_a_smaller_size_searches_on_its_own_name_with_half_the_trials() -> None:
    config = load_config(preset="cpu-demo", sets=["search.world_sizes=[2, 1]"])
    assert size_config(config, 2, primary=True) == config  # less an older best.yaml's sizes
    one = size_config(config, 1, primary=False)
    assert (one.name, one.cluster.num_workers, one.search.world_sizes) == ("cpu-demo-size1", 1, [])
    assert one.search.trials == 5 and config.search.trials == 9
    few = load_config(preset="smoke", sets=["search.world_sizes=[2, 1]"])
    assert size_config(few, 1, primary=False).search.trials == 3  # never more than the primary


def test_a_smaller_size_measures_windows_of_as_many_seconds_in_fewer_longer_steps() -> None:
    shape = ["search.measure_steps=9", "search.windows=3"]
    config = load_config(preset="cpu-demo", sets=[*shape, "search.world_sizes=[2, 1]"])
    one = size_config(config, 1, primary=False)  # 3 steps a window on 2 workers: 1.5 -> 2
    assert (one.search.measure_steps, one.search.windows) == (6, 3)
    wide = load_config(preset="cpu-demo", sets=[*shape, "cluster.num_workers=8",
                                                "workload.global_batch=64",
                                                "search.world_sizes=[8, 4, 2, 1]"])  # fmt: skip
    steps = [size_config(wide, n, primary=False).search.measure_steps for n in (4, 2, 1)]
    assert steps == [6, 3, 3]
    odd = load_config(preset="cpu-demo", sets=["search.measure_steps=20", "search.windows=4",
                                               "search.world_sizes=[2, 1]"])  # fmt: skip
    assert size_config(odd, 1, primary=False).search.measure_steps == 12  # 5 a window -> 3
    assert size_config(odd, 2, primary=True).search.measure_steps == 20  # the primary as set


def _best(folder: Path, sets: list[str], header: str = HEADER) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "best.yaml"
    path.write_text(header + dump_config(load_config(preset="cpu-demo", sets=sets)))
    return path


def test_best_yaml_gets_an_entry_per_size_that_train_reads_back(tmp_path: Path) -> None:
    primary = _best(tmp_path, ["tuned={accumulation_steps: 2}", "search.world_sizes=[2, 1]"])
    one = _best(tmp_path / "size-1", ["cluster.num_workers=1", "tuned={bucket_cap_mb: 4}"],
                header="# commtune best configuration: trial 0, 120.00 samples/s\n")  # fmt: skip
    entries = {2: read_entry(primary), 1: read_entry(one)}
    assert (
        entries[2]["verdict"]
        == "keep trial 3: 1.12x baseline (interval 1.05-1.20 from 6 window pairs)"
    )
    assert (entries[2]["trial"], entries[2]["samples_per_s"]) == (3, 210.5)
    assert "verdict" not in entries[1]  # nothing re-measured at that size
    lines = write_sizes(primary, entries, 2)
    assert lines == [
        "size 1: trial 0, 120.0 samples/s, {bucket_cap_mb=4}; no verdict",
        "size 2: trial 3, 210.5 samples/s, {accumulation_steps=2}; keep trial 3: 1.12x baseline",
    ]
    text = primary.read_text()
    assert text.startswith(HEADER) and "# sizes: one entry per world size searched (1, 2)" in text
    config = load_config(str(primary))
    assert (
        config.sizes[1]["tuned"] == {"bucket_cap_mb": 4}
        and config.sizes[1]["samples_per_s"] == 120.0
    )
    assert config.sizes[2]["tuned"] == config.tuned == {"accumulation_steps": 2}
    assert config.search.world_sizes == []  # best.yaml trains; it does not search again
    assert read_entry(tmp_path / "nothing" / "best.yaml") is None


def test_a_searched_strategy_and_a_variable_that_cannot_switch(tmp_path: Path) -> None:
    primary = _best(tmp_path, ["strategy=ddp", "search.world_sizes=[2, 1]"])
    alloc = "env={PYTORCH_CUDA_ALLOC_CONF: 'expandable_segments:True'}"
    one = _best(tmp_path / "size-1", ["cluster.num_workers=1", "strategy=fsdp", alloc])
    entries = {2: read_entry(primary), 1: read_entry(one)}
    lines = write_sizes(primary, entries, 2)
    assert lines[0].startswith("size 1: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True not kept")
    config = load_config(str(primary))  # it loads: what train reads
    assert config.sizes[1]["tuned"]["strategy"] == "fsdp" and config.sizes[1]["env"] == {}
    assert write_sizes(tmp_path / "x" / "best.yaml", {}, 2)[0].startswith("the 2-worker search")


def _search_error(*argv: str) -> tuple[int, str]:
    import contextlib
    import io

    from orchestrator.search.cli import main

    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main(list(argv))
    return code, err.getvalue() + out.getvalue()


@pytest.mark.parametrize(("argv", "said"), [
    (["--workers", "2:1"], "error: --workers: '2:1' is not N or MIN:MAX"),
    (["--workers", "0"], "error: --workers: '0' is not N or MIN:MAX"),
    (["--workers", "two"], "error: --workers: 'two' is not N or MIN:MAX"),
    (["--workers", "1:"], "error: --workers: '1:' is not N or MIN:MAX"),
    (["--workers", "1:3"], "error: --workers: 3 workers cannot carry workload.global_batch=32 "
                           "exactly; use --workers 1:2"),
    (["--workers", "1:99999"], "error: --workers: '1:99999' is not N or MIN:MAX"),
    (["--workers", "²"], "error: --workers: '²' is not N or MIN:MAX"),
    (["--workers", "3"], "error: --workers: 3 workers cannot carry workload.global_batch=32 "
                         "exactly; use --workers 2 or --workers 4"),
    (["--workers", "1:2", "--dry-run"], "error: --workers: a dry run prices one size; give one"),
    (["--workers", "1:2", "--set", "search.world_sizes=[2]"], "error: --workers: search.world_"),
    (["--workers", "1:4", "--set", "strategy=fsdp", "--set", "tuned={reshard_after_forward: 2}"],
     "error: tuned.reshard_after_forward: at 2 workers (search.world_sizes)"),
])  # fmt: skip
def test_a_mistyped_range_stops_before_ray_naming_the_key(argv: list[str], said: str) -> None:
    code, text = _search_error("--preset", "cpu-demo", *argv, "--out", "/nonexistent/x")
    assert code == 2 and said in text, text


def test_a_size_with_no_exact_split_is_said_and_left_out(tmp_path: Path) -> None:
    from orchestrator.search.cli import _settings, parse_args

    args = parse_args(["--preset", "cpu-demo", "--workers", "3:4"])
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        config, _ = _settings(args)
    assert config.search.world_sizes == [4] and config.cluster.num_workers == 4
    assert "--workers: 3 workers cannot carry workload.global_batch=32 exactly" in out.getvalue()


def test_a_single_size_is_the_usual_search_at_that_size() -> None:
    from orchestrator.search.cli import _settings, parse_args

    config, _ = _settings(parse_args(["--preset", "cpu-demo", "--workers", "1"]))
    assert config.cluster.num_workers == 1 and config.search.world_sizes == []
    code, text = _search_error("--preset", "cpu-demo", "--workers", "1", "--dry-run")
    assert code == 0 and "1 ranks on loopback_gloo" in text, text


def test_training_refuses_a_range_in_which_no_size_splits_the_batch() -> None:
    from orchestrator.train.cli import configure, parse_args

    for workers, said in (("3", "3 workers cannot carry workload.global_batch=32 exactly; use "
                                "--workers 2 or --workers 4"),
                          ("5:7", "no size of 5:7 can carry workload.global_batch=32 exactly; use "
                                  "--workers 4:7 or --workers 5:8")):  # fmt: skip
        with pytest.raises(ConfigError) as e:
            configure(parse_args(["--preset", "cpu-demo", "--workers", workers]))
        assert e.value.key == "--workers" and said in str(e.value), e.value
    config = configure(parse_args(["--preset", "cpu-demo", "--workers", "1:3"]))
    assert (config.train.min_workers, config.train.max_workers) == (1, 3)  # 3 waits for 1 or 2
