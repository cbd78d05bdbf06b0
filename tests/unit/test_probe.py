"""The bandwidth probe's pure parts: size parsing, busbw against hand values, CSV and table."""

from __future__ import annotations

import csv

import pytest

from orchestrator.config.inputs import parse_env_items
from orchestrator.config.schema import Config, ConfigError
from orchestrator.planning.costmodel import bus_factor
from orchestrator.probe import cli as probe
from orchestrator.probe.cli import Table
from orchestrator.probe.sweep import (
    COLUMNS,
    ProbeSettings,
    format_size,
    parse_ops,
    parse_size,
    parse_sizes,
    probe_config,
    with_busbw,
    write_csv,
)
from train_fns.collectives import fits, make_row, num_timed_iters
from train_fns.metrics import OPS


@pytest.mark.parametrize(
    ("text", "expected"),
    [("4096", 4096), ("1K", 1024), ("1k", 1024), ("64M", 64 * 2**20), ("1G", 2**30)],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


def test_parse_sizes_powers_of_two_both_bounds_included() -> None:
    assert parse_sizes("1K:64M") == [2**k for k in range(10, 27)]
    assert parse_sizes("1K:1G")[-1] == 2**30
    assert parse_sizes("1000:5000") == [1024, 2048, 4096]  # bounds need not be powers of two
    assert parse_sizes("1M") == [2**20]


@pytest.mark.parametrize(
    "text", ["1K:", ":1K", "64M:1K", "abc", "1K:2X", "1K:64M:1G", "2:8", "5:7"]
)
def test_parse_sizes_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^--sizes: "):
        parse_sizes(text)


def test_parse_ops() -> None:
    assert parse_ops("all") == OPS
    ops = parse_ops("reduce_scatter, all_reduce,reduce_scatter")
    assert ops == ("reduce_scatter", "all_reduce")  # order kept, repeats dropped
    for text in ("all_reduce,broadcast", "", "all,all_reduce"):
        with pytest.raises(ConfigError, match=r"^--ops: "):
            parse_ops(text)


@pytest.mark.parametrize(
    ("op", "n", "algbw", "busbw"),
    [
        ("all_reduce", 2, 10.0, 10.0),  # 2(n-1)/n = 1
        ("all_reduce", 8, 10.0, 17.5),  # 2 * 7 / 8 = 1.75
        ("all_gather", 4, 10.0, 7.5),  # (n-1)/n = 0.75
        ("reduce_scatter", 4, 10.0, 7.5),
        ("all_gather", 2, 10.0, 5.0),
        ("all_reduce", 1, 10.0, 0.0),  # one rank moves nothing
    ],
)
def test_bus_bandwidth_hand_values(op: str, n: int, algbw: float, busbw: float) -> None:
    assert algbw * bus_factor(op, n) == busbw
    row = with_busbw(make_row(op, 10_000_000_000, n, "gloo", 1.0, 5))
    assert (row["algbw_gbps"], row["busbw_gbps"]) == (algbw, busbw)


def test_bus_factor_rejects_unknown_op() -> None:
    with pytest.raises(ValueError, match="broadcast"):
        bus_factor("broadcast", 2)


def test_fits_needs_whole_float32_shards() -> None:
    assert fits("all_reduce", 4, 3)
    assert not fits("all_gather", 4, 2)  # two ranks cannot share one float32
    assert fits("reduce_scatter", 8, 2)
    assert not fits("all_gather", 1024, 3)  # a power of two never splits over 3 ranks


@pytest.mark.parametrize(
    ("first_s", "iters", "expected"),
    [(1e-5, 20, 20), (0.1, 20, 5), (1.0, 20, 3), (1.0, 2, 2)],
)
def test_num_timed_iters_fits_the_budget(first_s: float, iters: int, expected: int) -> None:
    assert num_timed_iters(first_s, iters, budget_s=0.5) == expected


def test_format_size() -> None:
    assert [format_size(s) for s in (512, 1024, 3 * 2**20, 2**30, 1536)] == [
        "512",
        "1K",
        "3M",
        "1G",
        "1536",
    ]


def _rows() -> list[dict]:
    return [
        with_busbw(make_row("all_reduce", 1024, 2, "gloo", 1e-4, 20)),
        with_busbw(make_row("all_reduce", 2048, 2, "gloo", 1.5e-4, 20)),
        with_busbw(make_row("all_gather", 1024, 2, "gloo", 2e-4, 20)),
    ]


def test_write_csv_round_trip(tmp_path) -> None:
    rows = _rows()
    path = write_csv(rows, tmp_path / "out" / "probe.csv")
    with path.open() as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ()) == COLUMNS
        back = list(reader)
    assert [r["op"] for r in back] == ["all_reduce", "all_reduce", "all_gather"]
    for row, read in zip(rows, back, strict=True):
        assert int(read["size_bytes"]) == row["size_bytes"]
        assert float(read["busbw_gbps"]) == row["busbw_gbps"]  # full precision kept
        assert read["backend"] == "gloo" and int(read["iters"]) == 20
    assert not list(tmp_path.glob("out/*.tmp"))


def test_table_prints_a_header_per_op_and_a_line_per_size(capsys) -> None:
    table = Table()
    for row in _rows():
        table(row)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert lines[0].startswith("all_reduce on 2 ranks (gloo), busbw = algbw x 1")
    assert lines[2].split()[:2] == ["1K", "100.0"]
    assert lines[3].split()[0] == "2K"
    assert lines[4].startswith("all_gather on 2 ranks (gloo), busbw = algbw x 0.5")
    assert len(lines) == 7


def test_parse_env_and_probe_config() -> None:
    assert parse_env_items(["NCCL_BUFFSIZE=8388608", "NCCL_ALGO=Ring"], "--env") == {
        "NCCL_BUFFSIZE": "8388608",
        "NCCL_ALGO": "Ring",
    }
    with pytest.raises(ConfigError, match=r"^--env: "):
        parse_env_items(["NCCL_BUFFSIZE"], "--env")
    base = Config(env={"NCCL_ALGO": "allreduce:tree"})
    config = probe_config(base, 3, None, "gloo", {"NCCL_BUFFSIZE": "8388608"})
    assert config.cluster.num_workers == 3  # any world size: the workload is a placeholder
    assert config.cluster.use_gpu is False
    assert config.env == {"NCCL_ALGO": "allreduce:tree", "NCCL_BUFFSIZE": "8388608"}
    assert probe_config(base, None, None, "nccl", {}).cluster.use_gpu is True
    assert probe_config(base, None, None, None, {}).cluster.use_gpu == "auto"
    with pytest.raises(ConfigError, match=r"^--env LD_PRELOAD: "):
        probe_config(base, None, None, None, {"LD_PRELOAD": "x.so"})


def test_settings_reject_bad_counts() -> None:
    with pytest.raises(ConfigError, match=r"^--iters: "):
        ProbeSettings(iters=0)
    with pytest.raises(ConfigError, match=r"^--warmup: "):
        ProbeSettings(warmup=0)


@pytest.mark.parametrize(
    ("argv", "key"),
    [
        (["--sizes", "1K:"], "--sizes"),
        (["--sizes", "64M:1K"], "--sizes"),
        (["--ops", "all_reduce,alltoall"], "--ops"),
        (["--env", "PYTHONPATH=/tmp"], "--env PYTHONPATH"),
        (["--workers", "0"], "--workers"),
    ],
)
def test_cli_usage_errors_exit_2_before_ray(monkeypatch, capsys, argv: list[str], key: str) -> None:
    def no_ray(*args: object, **kwargs: object) -> None:
        raise AssertionError("Ray must not start on a usage error")

    monkeypatch.setattr(probe, "run_probe", no_ray)
    assert probe.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"commtune: error: {key}: ")


@pytest.mark.parametrize(
    ("argv", "config_workers", "key"),
    [(["--workers", "1"], None, "--workers"), ([], 1, "cluster.num_workers")],
)
def test_one_worker_is_refused_before_ray(
    monkeypatch, capsys, tmp_path, argv: list[str], config_workers: int | None, key: str
) -> None:
    """One worker has no one to exchange with: every collective moves nothing and busbw came
    out 0. Refused with the flag (or the --config key) that set it, before Ray starts."""

    def no_ray(*args: object, **kwargs: object) -> None:
        raise AssertionError("Ray must not start on a usage error")

    monkeypatch.setattr(probe, "run_probe", no_ray)
    monkeypatch.setattr(probe, "start_ray", no_ray)
    if config_workers is not None:
        config = tmp_path / "one.yaml"
        config.write_text(f"cluster:\n  num_workers: {config_workers}\n")
        argv = [*argv, "--config", str(config)]
    assert probe.main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"commtune: error: {key}: "), err
    assert "2 or more" in err[0] and "--workers 2" in err[0]
