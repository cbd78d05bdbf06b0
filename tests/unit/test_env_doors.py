"""Environment variables: doors refused from every route, values checked as NCCL reads them.

Routes: a config's ``env:``, ``--set env.X=``, a user space file, ``submit --env`` and the
probe's ``--env``. Values: YAML booleans/nulls, ASCII digits, NCCL's ALGO/PROTO grammar,
and settings NCCL says can corrupt data (opt-in through ``search.unsafe_nccl``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.config.inputs import parse_env_items
from orchestrator.config.schema import ConfigError, load_config
from orchestrator.probe.sweep import probe_config
from search_spaces import (
    SearchContext,
    SearchSpace,
    SpaceError,
    check_env,
    check_env_var,
    env_strings,
    load_space_file,
    load_spaces,
    shipped_space_names,
)
from search_spaces._nccl import forces_ll128, parse_list, uncovered

DOORS = [
    "NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "NCCL_PROFILER_PLUGIN", "NCCL_ENV_PLUGIN",
    "NCCL_GIN_PLUGIN", "FI_PROVIDER_PATH", "NCCL_CONF_FILE", "NCCL_DEBUG_FILE",
    "NCCL_TOPO_DUMP_FILE", "NCCL_TOPO_FILE", "NCCL_GRAPH_FILE", "NCCL_GRAPH_DUMP_FILE",
    "NCCL_TUNER_CONFIG_FILE", "NCCL_IBVERBS_LIB", "NCCL_INSPECTOR_DUMP_DIR",
    "NCCL_PROFILE_DUMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_NCCL_DUMP_ON_TIMEOUT",
    "OFI_NCCL_TOPO_FILE_TEMPLATE", "UCX_MODULE_DIR", "NCCL_COMM_ID", "RDMAV_DRIVERS",
    "LD_LIBRARY_PATH",
]  # fmt: skip
"""Variables that load a library or read/write a path (or redirect the bootstrap)."""
ALLOWED = {
    "OFI_NCCL_PROTOCOL": "RDMA",
    "OFI_NCCL_NIC_DUP_CONNS": "2",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "CUDA_DEVICE_MAX_CONNECTIONS": "1",
    "NCCL_NET": "Socket",
}


def job_env(pairs: list[str]) -> dict[str, str]:
    """What `submit --env` does with its pairs."""
    return parse_env_items(pairs, "--env")


def _fails(route: Any, name: str, *fragments: str) -> None:
    with pytest.raises((ConfigError, SpaceError)) as err:
        route()
    text = str(err.value)
    assert name in text and all(f in text for f in fragments), text


@pytest.mark.parametrize("name", DOORS)
def test_doors_are_refused_from_every_route(name: str, tmp_path: Path) -> None:
    why = ("library", "file", "folder", "path", "bootstrap", "dump")
    config = tmp_path / "c.yaml"
    config.write_text(f"env:\n  {name}: /tmp/evil.so\n")
    _fails(lambda: load_config(str(config), preset="smoke"), f"env.{name}")
    _fails(lambda: load_config(preset="smoke", sets=[f"env.{name}=/tmp/x"]), f"env.{name}")
    _fails(lambda: job_env([f"{name}=/tmp/x"]), f"--env {name}")
    base = load_config(preset="smoke")
    _fails(lambda: probe_config(base, None, None, None, {name: "/tmp/x"}), f"--env {name}")
    space = tmp_path / "mine.yaml"
    space.write_text(
        f"name: mine\nparams:\n  {name}:\n"
        "    {type: categorical, choices: [null, x], default: null}\n"
    )
    _fails(lambda: load_space_file(space), f"mine.params.{name}")
    with pytest.raises(SpaceError) as err:
        check_env_var(name, "x")
    assert any(w in err.value.message for w in why) or "not an allowed" in err.value.message


def test_allowed_variables_pass_every_route() -> None:
    assert load_config(preset="smoke", sets=[f"env.{k}={v}" for k, v in ALLOWED.items()]).env == (
        ALLOWED
    )
    assert job_env([f"{k}={v}" for k, v in ALLOWED.items()]) == ALLOWED


def test_yaml_booleans_and_nulls_become_what_nccl_reads(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "env:\n  NCCL_IB_DISABLE: true\n  NCCL_P2P_DISABLE: false\n  NCCL_ALGO: null\n"
        "  NCCL_BUFFSIZE: 8388608\n"
    )
    env = load_config(str(config), preset="smoke").env
    assert env == {"NCCL_IB_DISABLE": "1", "NCCL_P2P_DISABLE": "0", "NCCL_BUFFSIZE": "8388608"}
    sets = ["env.NCCL_SHM_DISABLE=true", "env.NCCL_IB_DISABLE=null"]
    assert load_config(str(config), preset="smoke", sets=sets).env["NCCL_SHM_DISABLE"] == "1"
    assert "NCCL_IB_DISABLE" not in load_config(str(config), preset="smoke", sets=sets).env
    # a flag spelled as a word is what NCCL's strtoll reads as 0: refused, not passed on
    _fails(lambda: job_env(["NCCL_IB_DISABLE=True"]), "NCCL_IB_DISABLE", "1 or 0")


@pytest.mark.parametrize("value", ["²", "٤", "4.0", "1e6", " 4", "0x10", "-4"])
def test_numbers_must_be_ascii_digits(value: str) -> None:
    with pytest.raises(SpaceError) as err:
        env_strings({"NCCL_BUFFSIZE": value})
    assert err.value.key == "NCCL_BUFFSIZE"
    if value not in (" 4", "0x10"):  # --set reads these as YAML ints 4 and 16: right
        sets = [f"env.NCCL_MIN_CTAS={value}"]
        _fails(lambda: load_config(preset="smoke", sets=sets), "env.NCCL_MIN_CTAS")


def test_values_by_kind() -> None:
    good = {"NCCL_P2P_LEVEL": "nvl", "NCCL_NET_GDR_LEVEL": "5", "NCCL_DEBUG": "info",
            "NCCL_NVLS_ENABLE": "0", "NCCL_IB_QPS_PER_CONNECTION": "4"}  # fmt: skip
    check_env(good)
    for name, value in [("NCCL_P2P_LEVEL", "NVLINK"), ("NCCL_NVLS_ENABLE", "3"),
                        ("NCCL_IB_QPS_PER_CONNECTION", "0"), ("NCCL_NTHREADS", "100"),
                        ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True;rm -rf"),
                        ("PYTORCH_CUDA_ALLOC_CONF", "nosuch:1"),
                        ("NCCL_SOCKET_IFNAME", "é")]:  # fmt: skip
        with pytest.raises(SpaceError) as err:
            check_env_var(name, value)
        assert err.value.key == name and repr(value) in err.value.message


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("glibc.rtld.optional_static_tls=512", "glibc.malloc.NAME=VALUE"),  # not a malloc one
        ("glibc.cpu.hwcaps=-AVX2", "glibc.malloc.NAME=VALUE"),  # picks CPU code paths
        ("glibc.malloc.mmap_max=0;glibc.malloc.arena_max=1", "ASCII digits"),  # ';' not ':'
        ("glibc.malloc.nosuch=1", "'glibc.malloc.nosuch=1' is not"),
        ("mmap_max=0", "'mmap_max=0' is not"),  # the glibc.malloc. prefix is needed
        ("glibc.malloc.mmap_max", "glibc.malloc.NAME=VALUE"),  # no value
        ("glibc.malloc.mmap_max=-1", "ASCII digits"),
        ("glibc.malloc.mmap_max=0:", "'' is not"),  # an empty item
    ],
)
def test_glibc_tunables_take_malloc_numbers_only(value: str, fragment: str) -> None:
    """GLIBC_TUNABLES is allowed for glibc's malloc settings (docs/search-spaces.md), nothing
    else: other tunables pick code paths or change the loader."""
    with pytest.raises(SpaceError) as err:
        check_env_var("GLIBC_TUNABLES", value)
    assert err.value.key == "GLIBC_TUNABLES" and fragment in err.value.message, err.value.message


def test_glibc_tunables_the_benchmark_measures_pass() -> None:
    tuned = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=100000000000"
    assert env_strings({"GLIBC_TUNABLES": tuned}) == {"GLIBC_TUNABLES": tuned}
    check_env_var("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")


ALGO_OK = [
    "Ring", "ring", "RING,tree", "^tree", "^NVLS,nvlstree", "allreduce:tree", "AllReduce:Tree",
    "ring;allreduce:tree", "allreduce:tree;allgather:ring", "allreduce:^ring",
    "allgather:pat;reducescatter:pat",
    "ring,collnetdirect;allreduce:tree,collnetdirect;broadcast:ring",
    "ring,,tree", "ring;",
]  # fmt: skip
ALGO_BAD = {
    "Tree": "no algorithm",  # AllGather has no Tree: every DDP/FSDP trial fails
    "tree,nvls": "no algorithm",  # Broadcast/Reduce have ring only
    "treee": "unknown name",
    "allreduce:tree;ring": "prefix",  # only the first entry may lack a prefix
    "allreduc:tree": "unknown collective",
    ":": "no names",
    "all reduce:tree": "unknown collective",
    "allreduce: tree": "unknown name",
}
PROTO_OK = ["LL", "ll128", "Simple", "^LL128", "^LL,LL128", "LL,Simple;allreduce:^LL",
            "^LL128;allreduce:LL128"]  # fmt: skip
PROTO_BAD = {"LL129": "unknown name", "^LL,LL128,Simple": "no algorithm", "simple;LL": "prefix"}


@pytest.mark.parametrize("value", ALGO_OK)
def test_algo_grammar_accepts_what_nccl_accepts(value: str) -> None:
    check_env_var("NCCL_ALGO", value)


@pytest.mark.parametrize(("value", "fragment"), [*ALGO_BAD.items()])
def test_algo_grammar_refuses_what_nccl_refuses(value: str, fragment: str) -> None:
    with pytest.raises(SpaceError) as err:
        check_env_var("NCCL_ALGO", value)
    message = err.value.message
    assert err.value.key == "NCCL_ALGO" and repr(value) in message and fragment in message
    assert "e.g." in message  # names the fix


@pytest.mark.parametrize("value", PROTO_OK)
def test_proto_grammar_accepts_what_nccl_accepts(value: str) -> None:
    check_env_var("NCCL_PROTO", value)


@pytest.mark.parametrize(("value", "fragment"), [*PROTO_BAD.items()])
def test_proto_grammar_refuses_what_nccl_refuses(value: str, fragment: str) -> None:
    with pytest.raises(SpaceError, match=fragment):
        check_env_var("NCCL_PROTO", value)


def test_parser_follows_nccl_semantics() -> None:
    state = parse_list("ring;allreduce:tree", ("Tree", "Ring", "PAT"))
    assert state["AllReduce"] == {"Tree": 1, "Ring": 0, "PAT": 0}
    assert state["AllGather"] == {"Tree": 0, "Ring": 1, "PAT": 0}
    assert uncovered("allgather:pat", "LL") == ["AllGather"]  # PAT runs Simple only
    assert uncovered("allreduce:tree", "^LL128") == []
    assert forces_ll128("^LL") == forces_ll128("LL128") != []  # ^LL turns LL128 on outright
    assert forces_ll128("^LL128") == forces_ll128("Simple") == []
    assert forces_ll128("allreduce:^LL") == ["AllReduce"]


def test_algo_with_proto_combinations() -> None:
    check_env({"NCCL_ALGO": "allgather:pat", "NCCL_PROTO": "^LL128"})
    with pytest.raises(SpaceError, match="NCCL_PROTO='LL'") as err:
        check_env({"NCCL_ALGO": "allgather:pat", "NCCL_PROTO": "LL"})
    assert err.value.key == "NCCL_ALGO"


@pytest.mark.parametrize(
    ("name", "value"),
    [("NCCL_PROTO", "LL128"), ("NCCL_PROTO", "^LL"), ("NCCL_IB_PCI_RELAXED_ORDERING", "1"),
     ("OFI_NCCL_GDR_FLUSH_DISABLE", "1")],
)  # fmt: skip
def test_unsafe_nccl_is_opt_in(name: str, value: str) -> None:
    sets = [f"env.{name}={value}"]
    _fails(lambda: load_config(preset="smoke", sets=sets), f"env.{name}", "unsafe_nccl")
    _fails(lambda: job_env([f"{name}={value}"]), f"--env {name}", "unsafe_nccl")
    opted = load_config(preset="smoke", sets=[*sets, "search.unsafe_nccl=true"])
    assert opted.env == {name: value} and opted.search.unsafe_nccl is True


def test_unsafe_choices_are_left_out_of_the_space_unless_opted_in() -> None:
    specs = load_spaces(["nccl"])
    safe = SearchSpace(specs, SearchContext("nccl", "ddp", True, 8, 1, 64))
    assert "^LL" not in safe.grid_slice(["NCCL_PROTO"])[-1].values()
    assert {p["NCCL_PROTO"] for p in safe.grid_slice(["NCCL_PROTO"])} == {None, "^LL128", "Simple"}
    assert "unsafe_nccl" in dict(safe.dropped())["NCCL_PROTO=^LL"]
    opted = SearchSpace(specs, SearchContext("nccl", "ddp", True, 8, 1, 64, unsafe_nccl=True))
    assert "^LL" in {p["NCCL_PROTO"] for p in opted.grid_slice(["NCCL_PROTO"])}


def _algos(context: SearchContext) -> set[Any]:
    space = SearchSpace(load_spaces(["nccl"]), context)
    return {p["NCCL_ALGO"] for p in space.grid_slice(["NCCL_ALGO"])}


def test_algorithms_are_offered_only_where_the_hardware_has_them() -> None:
    base = {None, "allreduce:ring", "allreduce:tree"}
    assert _algos(SearchContext("nccl", "ddp", True, 8, 1, 64)) == base
    assert _algos(SearchContext("nccl", "ddp", True, 8, 1, 64, nvswitch=True)) == {
        *base, "allreduce:nvls"}  # fmt: skip
    assert _algos(SearchContext("nccl", "ddp", True, 16, 2, 64, nvswitch=True)) == {
        *base, "allreduce:nvlstree"}  # fmt: skip
    assert _algos(SearchContext("nccl", "ddp", True, 4, 4, 64)) == {
        *base, "allgather:pat;reducescatter:pat"}  # fmt: skip
    for context in (SearchContext("nccl", "fsdp", True, 16, 2, 64, nvswitch=True),
                    SearchContext("nccl", "ddp", True, 4, 4, 64)):  # fmt: skip
        space = SearchSpace(load_spaces(["nccl"]), context)
        for point in space.grid_slice(["NCCL_ALGO", "NCCL_PROTO"]):
            check_env(space.env_vars(point))  # no offered pair leaves a collective nothing


def test_single_node_drops_the_network_knobs() -> None:
    space = SearchSpace(load_spaces(["nccl"]), SearchContext("nccl", "ddp", True, 8, 1, 64))
    dropped = dict(space.dropped())
    for name in ("NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD", "NCCL_CROSS_NIC",
                 "NCCL_NET_GDR_LEVEL", "NCCL_IB_QPS_PER_CONNECTION"):  # fmt: skip
        assert name not in space.param_names and "1 node" in dropped[name]
    per_node = SearchSpace(load_spaces(["nccl"]), SearchContext("nccl", "ddp", True, 4, 4, 64))
    assert "NCCL_P2P_LEVEL" not in per_node.param_names


def test_a_choice_condition_may_test_only_context_values(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(
        "name: mine\nparams:\n  NCCL_ALGO:\n    type: categorical\n    default: null\n"
        "    choices: [null, {value: allreduce:tree, when: NCCL_PROTO == Simple}]\n"
    )
    _fails(lambda: load_space_file(path), "mine.params.NCCL_ALGO.choices[1].when", "context")


@pytest.mark.parametrize("name", shipped_space_names())
def test_every_shipped_space_still_loads(name: str) -> None:
    assert load_spaces([name])[0].params


@pytest.mark.parametrize(
    ("name", "value", "ok"),
    [
        ("NCCL_SOCKET_IFNAME", "^docker,lo", True),
        ("NCCL_SOCKET_IFNAME", "=eth0", True),
        ("NCCL_SOCKET_IFNAME", "^", False),
        ("NCCL_SOCKET_IFNAME", "eth0,,eth1", False),
        ("NCCL_SOCKET_IFNAME", "x" * 16, False),
        ("GLOO_SOCKET_IFNAME", "eth0", True),
        ("GLOO_SOCKET_IFNAME", "^lo", False),  # gloo: exact names only
        ("GLOO_SOCKET_IFNAME", "=eth0", False),
    ],
)
def test_interface_names_are_checked_by_who_reads_them(name: str, value: str, ok: bool) -> None:
    """A bad GLOO_SOCKET_IFNAME failed every worker's process group at init:
    refused before a worker starts, naming the variable."""
    if ok:
        load_config(preset="smoke", sets=[f"env.{name}={value}"])
    else:
        with pytest.raises(ConfigError, match=name):
            load_config(preset="smoke", sets=[f"env.{name}={value}"])
