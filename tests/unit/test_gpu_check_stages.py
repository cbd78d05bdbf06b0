"""The GPU check's version and NCCL-value stages, as far as the CPU shows them: the floors are
read from pyproject and the NCCL grammar, a library below its floor is named, and every
NCCL_ALGO/NCCL_PROTO value the shipped space can offer is one the check hands to NCCL."""

from __future__ import annotations

from pathlib import Path

from benchmarks.gpu_check_stages import floors, offered_values, version_lines
from search_spaces._nccl import PREFIX_SINCE

ROOT = Path(__file__).resolve().parents[2]


def test_the_floors_are_pyprojects_and_the_grammars() -> None:
    floor = floors((ROOT / "pyproject.toml").read_text(), PREFIX_SINCE)
    assert floor["torch"] >= (2, 8) and floor["transformers"] >= (4, 56)
    assert floor["NCCL"] == (2, 24) and floor["CUDA"] == (12, 6)


def test_a_library_below_its_floor_is_named() -> None:
    floor = {"torch": (2, 8), "NCCL": (2, 24), "CUDA": (12, 6)}
    lines = version_lines({"torch": "2.11.0", "NCCL": "2.23.4", "CUDA": "12.8"}, floor)
    assert lines == ["  torch 2.11.0 >= 2.8 ok", "  NCCL 2.23.4 >= 2.24 BELOW",
                     "  CUDA 12.8 >= 12.6 ok"]  # fmt: skip
    assert version_lines({"CUDA": "12.4"}, floor) == ["  CUDA 12.4 >= 12.6 BELOW"]
    assert version_lines({"NCCL": None}, floor) == ["  NCCL None >= 2.24 none (no CUDA)"]
    assert version_lines({"transformers": "5.2"}, floor) == ["  transformers 5.2"]


def test_every_value_the_space_can_offer_is_checked() -> None:
    offered = offered_values(ROOT / "search_spaces" / "nccl.yaml")
    assert {"allreduce:ring", "allreduce:nvls", "allreduce:nvlstree"} <= set(offered["NCCL_ALGO"])
    assert set(offered["NCCL_PROTO"]) == {"^LL128", "Simple", "^LL"}
