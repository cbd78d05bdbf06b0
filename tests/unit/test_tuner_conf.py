"""NCCL's tuner file from recorded sweeps: the fastest algorithm/protocol per size, in ranges."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.probe.cli import main as probe_main
from orchestrator.probe.tuner_conf import UNBOUNDED, choose, sweep_env, write
from search_spaces import env_strings


def rows(op: str, times: dict[int, float]) -> list[dict]:
    return [{"op": op, "size_bytes": s, "time_s": t} for s, t in times.items()]


SWEEPS = {  # LL wins small messages, tree the middle, ring/simple large ones (a typical shape)
    ("all_reduce", "ring", "simple"): rows("all_reduce", {1024: 9e-6, 65536: 30e-6, 2**24: 2e-3}),
    ("all_reduce", "ring", "ll"): rows("all_reduce", {1024: 5e-6, 65536: 28e-6, 2**24: 9e-3}),
    ("all_reduce", "tree", "simple"): rows("all_reduce", {1024: 8e-6, 65536: 20e-6, 2**24: 3e-3}),
    ("all_gather", "ring", "simple"): rows("all_gather", {1024: 7e-6, 65536: 9e-6, 2**24: 1e-3}),
    ("all_gather", "ring", "ll"): rows("all_gather", {1024: 4e-6, 65536: 8e-6, 2**24: 4e-3}),
}


def test_choose_keeps_the_fastest_per_size_in_ranges() -> None:
    got = [(r.op, r.min_bytes, r.max_bytes, r.algorithm, r.protocol) for r in choose(SWEEPS)]
    assert got == [
        ("all_reduce", 0, 1024, "ring", "ll"),
        ("all_reduce", 1025, 65536, "tree", "simple"),
        ("all_reduce", 65537, UNBOUNDED, "ring", "simple"),
        ("all_gather", 0, 65536, "ring", "ll"),  # two sizes, one winner: one range
        ("all_gather", 65537, UNBOUNDED, "ring", "simple"),
    ]


def test_the_file_is_nccls_csv(tmp_path: Path) -> None:
    path = write(choose(SWEEPS), tmp_path / "nccl_tuner.conf", -1, 8)
    lines = [line for line in path.read_text().splitlines() if not line.startswith("#")]
    assert lines[0] == "allreduce,0,1024,ring,ll,-1,-1,8,-1,-1"
    assert all(len(line.split(",")) == 10 for line in lines)
    assert lines[-1].startswith("allgather,65537,9223372036854775807,ring,simple,")


def test_each_sweep_forces_one_collective_only() -> None:
    env = sweep_env("all_reduce", "tree", "ll")
    assert env == {"NCCL_ALGO": "allreduce:tree", "NCCL_PROTO": "allreduce:ll"}
    assert env_strings(env) == env  # what NCCL accepts, as the allow-list checks it


def test_tuner_conf_is_refused_on_gloo(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert probe_main(["--backend", "gloo", "--tuner-conf", "--out", str(tmp_path)]) == 2
    assert "--tuner-conf" in capsys.readouterr().err
