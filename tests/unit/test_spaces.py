"""Contract tests for search spaces: every shipped file, both samplers, every error path.

No Ray: spaces are plain Optuna define-by-run functions, sampled via ``study.ask()``.
"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any

import optuna
import pytest

from search_spaces import (
    PLAN_KNOBS,
    SearchContext,
    SearchSpace,
    SpaceError,
    check_env,
    check_env_var,
    is_env_name,
    load_space_file,
    load_spaces,
    shipped_space_names,
)
from train_fns.plan import DDPOptions, FSDPOptions, TrialPlan, split_global_batch

optuna.logging.set_verbosity(optuna.logging.WARNING)

SHIPPED = sorted((Path(__file__).parents[2] / "search_spaces").glob("*.yaml"))
ALL = ["strategy", "nccl", "accumulation", "ddp", "fsdp"]
DDP_KNOBS = {
    "bucket_cap_mb", "gradient_as_bucket_view", "static_graph", "broadcast_buffers", "comm_hook"
}  # fmt: skip
FSDP_KNOBS = {
    "reshard_after_forward", "forward_prefetch", "backward_prefetch", "hsdp", "reduce_dtype"
}  # fmt: skip
CONTEXTS = {
    "gpu-2nodes-search": SearchContext("nccl", "search", True, 16, 2, 512),
    "gpu-1node-fsdp": SearchContext("nccl", "fsdp", True, 4, 1, 64),
    "cpu-gloo-ddp": SearchContext("gloo", "ddp", False, 2, 1, 48),
}
SAMPLERS = {
    "random": lambda seed: optuna.samplers.RandomSampler(seed=seed),
    "tpe": lambda seed: optuna.samplers.TPESampler(seed=seed, n_startup_trials=20),
}


def _objective(params: dict[str, Any]) -> float:
    """Rewards many sockets so TPE presses on the constraint's boundary."""
    sockets = params.get("NCCL_SOCKET_NTHREADS", 1) * params.get("NCCL_NSOCKS_PERTHREAD", 1)
    return float(sockets + params.get("accumulation_steps", 1))


def _sample(space: SearchSpace, sampler: optuna.samplers.BaseSampler, n: int) -> list[dict]:
    study = optuna.create_study(direction="maximize", sampler=sampler)
    samples = []
    for _ in range(n):
        trial = study.ask()
        params = space.suggest(trial)
        study.tell(trial, _objective(params))
        samples.append(params)
    return samples


def _check_invariants(space: SearchSpace, ctx: SearchContext, params: dict[str, Any]) -> None:
    strategy = params["strategy"]
    if ctx.strategy_mode != "search":
        assert strategy == ctx.strategy_mode
    assert strategy == "ddp" or not DDP_KNOBS & params.keys()
    assert strategy == "fsdp" or not FSDP_KNOBS & params.keys()
    if ctx.backend == "gloo":
        assert not [k for k in params if k.startswith("NCCL_")]
    if "NCCL_MIN_NCHANNELS" in params:
        assert params["NCCL_MAX_NCHANNELS"] == params["NCCL_MIN_NCHANNELS"]
    if ctx.num_nodes == 1:
        assert "NCCL_SOCKET_NTHREADS" not in params
    if "NCCL_SOCKET_NTHREADS" in params:
        assert params["NCCL_SOCKET_NTHREADS"] * params["NCCL_NSOCKS_PERTHREAD"] <= 64
    if "accumulation_steps" in params:
        steps = params["accumulation_steps"]
        assert ctx.per_worker_batch % steps == 0 and steps <= 16
        split_global_batch(ctx.global_batch, ctx.world_size, steps)
    env = space.env_vars(params)
    check_env(env)
    assert all(is_env_name(k) and isinstance(v, str) for k, v in env.items())
    assert set(space.knobs(params)) <= PLAN_KNOBS


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_space_file_contract(path: Path) -> None:
    spec = load_space_file(path)
    assert spec.name == path.stem and spec.description
    assert path.read_text().startswith("#"), "document the file in a header comment"
    assert spec.name in shipped_space_names()
    ctx = CONTEXTS["gpu-2nodes-search"]
    names = ["strategy"] if spec.name == "strategy" else ["strategy", path]
    space = SearchSpace(load_spaces(names), ctx)
    assert space.env_vars(space.baseline()) == {}


def test_all_shipped_spaces_found() -> None:
    assert set(ALL) <= set(shipped_space_names())
    assert {p.stem for p in SHIPPED} == set(shipped_space_names())


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("name", [p.stem for p in SHIPPED])
def test_each_space_sampled_300_times(name: str, sampler: str) -> None:
    ctx = CONTEXTS["gpu-2nodes-search"]
    space = SearchSpace(load_spaces(list(dict.fromkeys(["strategy", name]))), ctx)
    for params in _sample(space, SAMPLERS[sampler](0), 300):
        _check_invariants(space, ctx, params)


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("ctx_id", CONTEXTS)
def test_all_spaces_sampled_300_times(ctx_id: str, sampler: str) -> None:
    ctx = CONTEXTS[ctx_id]
    space = SearchSpace(load_spaces(ALL), ctx)
    samples = _sample(space, SAMPLERS[sampler](1), 300)
    for params in samples:
        _check_invariants(space, ctx, params)
        if params["strategy"] == "ddp":
            # static_graph is only tried without accumulation (pytorch#143580)
            expected = DDP_KNOBS - {"comm_hook"}  # lossy: search.lossy is off here
            if params["accumulation_steps"] > 1:
                expected -= {"static_graph"}
            assert params.keys() >= expected and "comm_hook" not in params
            assert "static_graph" not in params or params["accumulation_steps"] == 1
        else:
            hsdp = ctx.num_nodes > 1 and isinstance(params["reshard_after_forward"], bool)
            expected = FSDP_KNOBS - {"reduce_dtype"} - (set() if hsdp else {"hsdp"})
            assert params.keys() >= expected and "reduce_dtype" not in params
            assert hsdp == ("hsdp" in params)
        assert (ctx.backend == "nccl") == ("NCCL_BUFFSIZE" in params)
    if ctx.strategy_mode == "search":
        assert {p["strategy"] for p in samples} == {"ddp", "fsdp"}
    if ctx.num_nodes > 1:  # the constraint's range restriction is exercised, not avoided
        products = [p["NCCL_SOCKET_NTHREADS"] * p["NCCL_NSOCKS_PERTHREAD"] for p in samples]
        assert max(products) > 32


def test_dropped_reasons() -> None:
    gloo = SearchSpace(load_spaces(ALL), CONTEXTS["cpu-gloo-ddp"])
    reasons = dict(gloo.dropped())
    assert "gloo" in reasons["nccl"] and "inert" in reasons["nccl"]
    assert "strategy is ddp" in reasons["fsdp"] and "strategy=ddp" in reasons["strategy"]
    one_node = dict(SearchSpace(load_spaces(ALL), CONTEXTS["gpu-1node-fsdp"]).dropped())
    assert "1 node" in one_node["NCCL_SOCKET_NTHREADS"] and "ddp" in one_node
    two_nodes = dict(SearchSpace(load_spaces(ALL), CONTEXTS["gpu-2nodes-search"]).dropped())
    assert set(two_nodes) == {  # only the choices this hardware or safety rules out
        "NCCL_ALGO=allreduce:nvls", "NCCL_ALGO=allreduce:nvlstree",
        "NCCL_ALGO=allgather:pat;reducescatter:pat", "NCCL_PROTO=^LL", "NCCL_NVLS_ENABLE",
        "comm_hook", "reduce_dtype",  # lossy: search.lossy is off
    }  # fmt: skip


@pytest.mark.parametrize("ctx_id", CONTEXTS)
def test_baseline_is_the_untouched_default(ctx_id: str) -> None:
    ctx = CONTEXTS[ctx_id]
    space = SearchSpace(load_spaces(ALL), ctx)
    base = space.baseline()
    assert space.env_vars(base) == {}
    _check_invariants(space, ctx, base)
    assert base["strategy"] == ("ddp" if ctx.strategy_mode == "search" else ctx.strategy_mode)
    plan_defaults = {
        **dataclasses.asdict(DDPOptions()),
        **dataclasses.asdict(FSDPOptions()),
        "accumulation_steps": 1,
        "activation_checkpointing": _field_default(TrialPlan, "activation_checkpointing"),
    }
    for name, value in space.knobs(base).items():
        if name != "strategy":
            assert value == plan_defaults[name], name


def _field_default(cls: type, name: str) -> Any:
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


def test_ddp_defaults_match_torch_and_plan() -> None:
    ddp = load_space_file(SHIPPED[0].parent / "ddp.yaml")
    defaults = {p.name: p.default for p in ddp.params}
    plan = dataclasses.asdict(DDPOptions())
    # set by the plan where the model needs it, never searched (ddp.yaml says why)
    assert plan.pop("find_unused_parameters") is False
    assert defaults == plan
    torch_ddp = pytest.importorskip("torch.nn.parallel.distributed")
    signature = inspect.signature(torch_ddp.DistributedDataParallel.__init__).parameters
    # torch spells "25 MB" as bucket_cap_mb=None resolved through this module constant
    torch_cap = signature["bucket_cap_mb"].default
    if torch_cap is None:
        torch_cap = getattr(torch_ddp, "_DEFAULT_BUCKET_CAP_MB", 25)
    assert defaults["bucket_cap_mb"] == torch_cap == 25
    for name in ("gradient_as_bucket_view", "static_graph"):
        assert defaults[name] is signature[name].default is False
    assert signature["find_unused_parameters"].default is DDPOptions().find_unused_parameters


def test_fsdp_defaults_match_plan() -> None:
    fsdp = load_space_file(SHIPPED[0].parent / "fsdp.yaml")
    defaults = {p.name: p.default for p in fsdp.params}
    assert defaults == dataclasses.asdict(FSDPOptions())
    memory = load_space_file(SHIPPED[0].parent / "accumulation.yaml")
    defaults = {p.name: p.default for p in memory.params}
    assert defaults["activation_checkpointing"] is _field_default(
        TrialPlan, "activation_checkpointing"
    )


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_seeded_sampling_is_reproducible(sampler: str) -> None:
    space = SearchSpace(load_spaces(ALL), CONTEXTS["gpu-2nodes-search"])
    first = _sample(space, SAMPLERS[sampler](7), 40)
    assert first == _sample(space, SAMPLERS[sampler](7), 40)
    assert first != _sample(space, SAMPLERS[sampler](8), 40)


def test_env_vars_and_knobs_split() -> None:
    space = SearchSpace(load_spaces(ALL), CONTEXTS["gpu-2nodes-search"])
    params = {
        **space.baseline(),
        "NCCL_BUFFSIZE": 8 << 20,
        "NCCL_MIN_NCHANNELS": 8,
        "NCCL_MAX_NCHANNELS": 8,
        "NCCL_ALGO": "allreduce:tree",
        "bucket_cap_mb": 50,
        "log2(NCCL_BUFFSIZE)": 23,  # Optuna's own name, present in a Ray Tune config
    }
    assert space.env_vars(params) == {
        "NCCL_BUFFSIZE": "8388608",
        "NCCL_MIN_NCHANNELS": "8",
        "NCCL_MAX_NCHANNELS": "8",
        "NCCL_ALGO": "allreduce:tree",
    }
    knobs = space.knobs(params)
    assert knobs["bucket_cap_mb"] == 50 and knobs["strategy"] == "ddp"
    assert not [k for k in knobs if k.startswith("NCCL_")]


def test_optuna_names_round_trip_and_enqueued_baseline() -> None:
    space = SearchSpace(load_spaces(ALL), CONTEXTS["gpu-2nodes-search"])
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    study.enqueue_trial(space.optuna_params(space.baseline()))
    for i in range(30):
        trial = study.ask()
        params = space.suggest(trial)
        if i == 0:
            assert params == space.baseline()
        assert space.optuna_params(params) == trial.params
        assert space.from_optuna_params(trial.params) == params
        study.tell(trial, 0.0)


def test_grid_enumerates_feasible_points(tmp_path: Path) -> None:
    ctx = CONTEXTS["cpu-gloo-ddp"]  # per-worker batch 24: divisors up to 16 are 1,2,3,4,6,8,12
    points = SearchSpace(load_spaces(ALL), ctx).grid()
    # 7 accumulations x 7 buckets x 2 bucket views, x 2 static_graph only at accumulation 1;
    # all of it x 2 checkpointing x 2 broadcast_buffers
    assert len(points) == (7 * 2 * 2 + 6 * 7 * 2) * 2 * 2
    assert len({tuple(sorted(p.items())) for p in points}) == len(points)
    sockets = SearchSpace(
        [_sockets_spec(tmp_path)], SearchContext("nccl", "ddp", True, 8, 2, 64)
    ).grid()
    brute = [(a, b) for a in range(1, 17) for b in range(1, 17) if a * b <= 64]
    assert sorted((p["NCCL_SOCKET_NTHREADS"], p["NCCL_NSOCKS_PERTHREAD"]) for p in sockets) == brute
    with pytest.raises(SpaceError, match="tpe/random") as err:
        SearchSpace(load_spaces(ALL), CONTEXTS["gpu-2nodes-search"]).grid(limit=1000)
    assert err.value.key == "grid"


def test_conditions_across_files(tmp_path: Path) -> None:
    text = (
        "name: extra\nparams:\n  TORCH_NCCL_BLOCKING_WAIT:\n"
        "    {type: bool, default: false,\n"
        "     when: NCCL_ALGO == 'allreduce:ring' or NCCL_MIN_NCHANNELS > 4}\n"
    )
    extra = _write(tmp_path, text, "extra")
    space = SearchSpace(load_spaces(["nccl", extra]), CONTEXTS["gpu-1node-fsdp"])
    seen = 0
    for params in _sample(space, SAMPLERS["random"](0), 200):
        active = params["NCCL_ALGO"] == "allreduce:ring" or (params["NCCL_MIN_NCHANNELS"] or 0) > 4
        assert ("TORCH_NCCL_BLOCKING_WAIT" in params) == active
        seen += active
    assert 0 < seen < 200
    with pytest.raises(SpaceError, match="not sampled before") as err:
        SearchSpace(load_spaces([extra, "nccl"]), CONTEXTS["gpu-1node-fsdp"])
    assert err.value.key == "extra.params.TORCH_NCCL_BLOCKING_WAIT.when"


def _sockets_spec(tmp_path: Path) -> Any:
    text = (
        "name: sockets\nparams:\n"
        "  NCCL_SOCKET_NTHREADS: {type: int, low: 1, high: 16, default: 1}\n"
        "  NCCL_NSOCKS_PERTHREAD: {type: int, low: 1, high: 16, default: 1}\n"
        "constraints: [NCCL_NSOCKS_PERTHREAD * NCCL_SOCKET_NTHREADS <= 64]\n"
    )
    return load_space_file(_write(tmp_path, text, "sockets"))


def _write(tmp_path: Path, text: str, name: str = "bad") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


_PARAM = "name: bad\nparams:\n  {}\n"
FILE_ERRORS = {
    "malformed": ("name: bad\ndescription: x\nparams: a: b\n", "bad.yaml", "line 3"),
    "duplicate key": (
        "name: bad\nparams:\n  NCCL_ALGO: {type: bool, default: false}\n"
        "  NCCL_ALGO: {type: bool, default: true}\n",
        "bad.yaml",
        "line 4",
    ),
    "unknown type": (
        _PARAM.format("NCCL_BUFFSIZE: {type: float, low: 1, high: 2, default: 1}"),
        "bad.params.NCCL_BUFFSIZE.type",
        "categorical",
    ),
    "missing default": (
        _PARAM.format("NCCL_ALGO: {type: categorical, choices: [null, Ring]}"),
        "bad.params.NCCL_ALGO.default",
        "library default",
    ),
    "default outside domain": (
        _PARAM.format("NCCL_BUFFSIZE: {type: pow2, low: 1024, high: 4096, default: 8192}"),
        "bad.params.NCCL_BUFFSIZE.default",
        "outside",
    ),
    "pow2 bound": (
        _PARAM.format("NCCL_BUFFSIZE: {type: pow2, low: 1000, high: 4096, default: 4096}"),
        "bad.params.NCCL_BUFFSIZE.low",
        "power of two",
    ),
    "typo key": (
        _PARAM.format("NCCL_SOCKET_NTHREADS: {type: int, low: 1, hgih: 4, default: 1}"),
        "bad.params.NCCL_SOCKET_NTHREADS.hgih",
        "allowed",
    ),
    "LD_PRELOAD": (
        _PARAM.format("LD_PRELOAD: {type: categorical, choices: [null, x.so], default: null}"),
        "bad.params.LD_PRELOAD",
        "TORCH_NCCL_",
    ),
    "NCCL_NCHANNELS": (
        _PARAM.format("NCCL_NCHANNELS: {type: int, low: 1, high: 8, default: 1}"),
        "bad.params.NCCL_NCHANNELS",
        "NCCL_MIN_NCHANNELS and NCCL_MAX_NCHANNELS",
    ),
    "unknown knob": (
        _PARAM.format("bucket_size: {type: int, low: 1, high: 8, default: 1}"),
        "bad.params.bucket_size",
        "bucket_cap_mb",
    ),
    "NCCL_NTHREADS=100": (
        _PARAM.format("NCCL_NTHREADS: {type: categorical, choices: [null, 100], default: null}"),
        "bad.params.NCCL_NTHREADS",
        "64, 128, 256, 512",
    ),
    "accumulation not divisor": (
        _PARAM.format("accumulation_steps: {type: int, low: 1, high: 8, default: 1}"),
        "bad.params.accumulation_steps.type",
        "divisor",
    ),
    "eval attempt": (
        "name: bad\nwhen: __import__('os').system('touch pwned')\n"
        "params:\n  NCCL_ALGO: {type: bool, default: false}\n",
        "bad.when",
        "name == value",
    ),
    "condition typo": (
        "name: bad\nwhen: backend == ncl\nparams:\n  NCCL_ALGO: {type: bool, default: false}\n",
        "bad.when",
        "nccl, gloo",
    ),
    "constraint on categorical": (
        "name: bad\nparams:\n  NCCL_SOCKET_NTHREADS: {type: int, low: 1, high: 16, default: 1}\n"
        "  NCCL_NSOCKS_PERTHREAD: {type: categorical, choices: [1, 16], default: 1}\n"
        "constraints: [NCCL_NSOCKS_PERTHREAD * NCCL_SOCKET_NTHREADS <= 64]\n",
        "bad.constraints[0]",
        "int",
    ),
    "sockets unconstrained": (
        "name: bad\nparams:\n  NCCL_SOCKET_NTHREADS: {type: int, low: 1, high: 16, default: 1}\n"
        "  NCCL_NSOCKS_PERTHREAD: {type: int, low: 1, high: 16, default: 1}\n",
        "bad.constraints",
        "<= 64",
    ),
    "infeasible constraint": (
        "name: bad\nparams:\n  NCCL_MIN_NCHANNELS: {type: int, low: 1, high: 8, default: 8}\n"
        "  NCCL_MAX_NCHANNELS: {type: int, low: 1, high: 8, default: 8}\n"
        "constraints: [NCCL_MAX_NCHANNELS + NCCL_MIN_NCHANNELS >= 12]\n",
        "bad.constraints",
        "widen",
    ),
}


@pytest.mark.parametrize("case", FILE_ERRORS)
def test_space_file_errors_name_the_key(case: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    text, key, fragment = FILE_ERRORS[case]
    path = _write(tmp_path, text)
    with pytest.raises(SpaceError) as err:
        load_space_file(path)
    assert err.value.key.endswith(key), err.value
    assert fragment in err.value.message, err.value
    assert not (tmp_path / "pwned").exists()


ENV_ERRORS = [
    ("LD_PRELOAD", "/tmp/x.so", "NCCL_, TORCH_NCCL_"),
    ("NCCL_NCHANNELS", "8", "NCCL_MIN_CTAS"),
    ("NCCL_BUFFSIZE", "abc", "ASCII digits"),
    ("NCCL_BUFFSIZE", "0", "out of range"),
    ("NCCL_BUFFSIZE", -1, "ASCII digits"),
    ("NCCL_NTHREADS", 100, "64, 128, 256, 512"),
    ("NCCL_ALGO", "Ring\nexport X=1", "newline"),
]


@pytest.mark.parametrize(("name", "value", "fragment"), ENV_ERRORS)
def test_env_var_errors(name: str, value: Any, fragment: str) -> None:
    with pytest.raises(SpaceError) as err:
        check_env_var(name, value)
    assert err.value.key == name and fragment in err.value.message


def test_env_mapping_checks() -> None:
    with pytest.raises(SpaceError, match="128") as err:
        check_env({"NCCL_SOCKET_NTHREADS": "16", "NCCL_NSOCKS_PERTHREAD": "8"})
    assert err.value.key == "NCCL_SOCKET_NTHREADS"
    check_env({"NCCL_SOCKET_NTHREADS": "8", "NCCL_NSOCKS_PERTHREAD": "8", "NCCL_ALGO": "Ring"})
    with pytest.raises(SpaceError, match="TORCH_NCCL_"):
        check_env({"NCCL_DEBUG": "INFO", "PYTHONPATH": "/x"})
    assert is_env_name("TORCH_NCCL_ASYNC_ERROR_HANDLING") and not is_env_name("LD_PRELOAD")


def test_load_spaces_errors(tmp_path: Path) -> None:
    with pytest.raises(SpaceError) as err:
        load_spaces(["nosuch"])
    assert err.value.key == "nosuch"
    assert all(name in err.value.message for name in shipped_space_names())
    with pytest.raises(SpaceError) as err:
        load_spaces([str(tmp_path / "missing.yaml")])
    assert "missing.yaml" in err.value.key and "nccl" in err.value.message
    algo = "NCCL_ALGO: {type: categorical, choices: [null], default: null}"
    mine = _write(tmp_path, _PARAM.format(algo), "mine")
    with pytest.raises(SpaceError) as err:
        load_spaces(["nccl", mine])
    assert err.value.key == "bad.params.NCCL_ALGO"
    assert str(mine) in err.value.message and "nccl.yaml" in err.value.message


def test_context_errors() -> None:
    with pytest.raises(SpaceError) as err:
        SearchSpace(load_spaces(["ddp"]), CONTEXTS["gpu-2nodes-search"])
    assert err.value.key == "context.strategy_mode" and "strategy" in err.value.message
    with pytest.raises(SpaceError) as err:
        SearchContext("nccl", "ddp", True, 4, 1, 30)
    assert err.value.key == "context.global_batch"
    with pytest.raises(SpaceError) as err:
        SearchContext("mpi", "ddp", True, 4, 1, 32)
    assert err.value.key == "context.backend"
