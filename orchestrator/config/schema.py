"""Configuration: presets, YAML files and ``--set`` overrides, validated once.

Everything the user can get wrong is caught here, before Ray starts, and
reported as a ``ConfigError`` that names the key and says how to fix it.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import shutil
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from orchestrator.config.address import check_address
from orchestrator.config.bounds import check_bounds
from orchestrator.config.inputs import (
    ConfigError,
    check_choice,
    check_finite,
    check_name,
    check_split,
    check_tuned,
    check_workload,
    merge,
    parse_set,
    read_yaml,
)
from orchestrator.config.size_entries import check_sizes, check_world_sizes
from orchestrator.config.storage_url import check_storage

PRESET_DIR = Path(__file__).parent / "presets"
PACK, SPREAD = "pack", "spread"
PLACEMENTS = (PACK, SPREAD)
"""How a worker group's ranks are placed (``cluster.placement``; ``orchestrator.cluster.placement``
places them)."""
SAMPLERS = ("staged", "tpe", "random", "grid")
STRATEGY_MODES = ("ddp", "fsdp", "search")
USE_GPU_VALUES = ("auto", True, False)
_FLOAT_TEXT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")  # not nan, inf, 1_000


@dataclass
class WorkloadConfig:
    """What is trained: the model, its data and the fixed global batch."""

    model: str = "bert-tiny"
    """Preset (bert-large, bert-base, bert-mini, bert-tiny, gpt2), HF model type or local dir."""
    task: str | None = None
    """``mlm`` or ``clm``; inferred from the model when omitted."""
    seq_len: int = 128
    global_batch: int = 32
    """Samples per optimizer step across all workers; the search never changes it."""
    data: str = "synthetic"
    tokenizer: str | None = None
    precision: str = "fp32"
    lr: float = 1e-4
    model_overrides: dict[str, Any] = field(default_factory=dict)
    entrypoint: str | None = None
    """Your own workload: ``path/to/file.py:make_workload`` or ``package.module:make_workload``
    (see ``train_fns.workload``); ``model``, ``task``, ``data`` and ``tokenizer`` then do not
    apply. Checked on the driver (``plans.check_entrypoint``) before Ray starts."""
    options: dict[str, Any] = field(default_factory=dict)
    """Passed to your ``make_workload`` as ``ctx.options``."""
    unused_parameters: bool | None = None
    """Whether steps leave some parameters without a gradient (a mixture of experts, a
    conditional branch): then DDP runs with ``find_unused_parameters=True`` in every plan, the
    baseline too. None: your workload declares it (``unused_parameters`` in what
    ``make_workload`` returns) or the driver finds out with a forward/backward of a few
    micro-batches on CPU; the built-in models use every parameter."""

    def __post_init__(self) -> None:
        check_bounds(self, "workload")
        check_choice("workload.task", self.task, ("mlm", "clm", None))
        check_choice("workload.precision", self.precision, ("fp32", "bf16", "fp16"))


@dataclass
class ClusterConfig:
    """Where trials run."""

    num_workers: int = 2
    use_gpu: Any = "auto"
    """``auto`` uses GPUs when the cluster has them; true/false force it."""
    cpus_per_worker: float = 1.0
    address: str | None = None
    """None starts a local Ray; ``auto`` or ``HOST:PORT`` joins a running cluster."""
    autoscaling: bool = False
    """True when the cluster grows on demand: too few resources now is then not an error."""
    placement: str = PACK
    """How a worker group's ranks sit on the nodes, strictly (orchestrator.cluster.placement):
    ``pack``
    (one node when one holds them, else whole nodes) or ``spread`` (one rank per node, else as
    even as the nodes allow). Ray's soft default would let placement drift between trials."""
    nvswitch: bool = False
    """The GPUs of a node share an NVSwitch with NVLink SHARP (HGX/DGX H100 and later): the
    search then offers NCCL's NVLS algorithms. Declared, not detected: the driver may run on
    a CPU head that cannot see the workers' topology."""

    def __post_init__(self) -> None:
        check_bounds(self, "cluster")
        check_choice("cluster.use_gpu", self.use_gpu, USE_GPU_VALUES)
        check_choice("cluster.placement", self.placement, PLACEMENTS)


@dataclass
class SearchConfig:
    """How the search runs and measures."""

    trials: int = 8
    """Total trials, baseline (trial 0) included."""
    sampler: str = "staged"
    """staged (memory shape, then communication knobs, then TPE), tpe, random or grid."""
    seed: int = 0
    spaces: list[str] = field(
        default_factory=lambda: ["strategy", "accumulation", "ddp", "fsdp", "nccl", "optimizer"]
    )
    warmup_steps: int = 3
    measure_steps: int = 12
    windows: int = 3
    trial_timeout_s: float = 900.0
    step_deadline_s: float = 300.0
    """A trial whose workers finish no step for this long is a hang."""
    start_timeout_s: float = 300.0
    """From a worker group's start until every rank has said it is ready: watched from the
    driver, so a worker frozen while its group starts is a ``hang`` in phase ``start``."""
    heartbeat_s: float = 30.0
    """A waiting search, training run or probe prints a plain line after this much silence."""
    storage: str | None = None
    """Optuna storage URL or journal path; default: SQLite ``study.db`` in the output folder
    (the journal ``study.journal`` on a network file system; see
    ``orchestrator.config.study_storage``)."""
    prune: bool = True
    """Stop a trial early when it is slower than the best by more than the measured noise."""
    early_stop: bool = True
    """Staged sampler: end the search before ``trials`` once the sampler's last trials (half
    its stage, at least one) raised nothing above the best's lower bound."""
    time_budget_min: float | None = None
    """Stop starting trials after this many minutes (the running one finishes)."""
    remeasure_top: int = 3
    """At most this many finalists are measured again beside the baseline at the end: those
    whose search figure is within the search's noise of the best (0: none, no verdict)."""
    remeasure_repeats: int = 2
    """Group pairing only: measure a disturbed run (window cv far above the others', or far
    from its configuration's other runs) again, up to this many times."""
    verdict_delta: float = 0.02
    """The noise threshold δ: a finalist is kept when its ratio to the baseline is above 1 + δ
    with 95% confidence, and "no gain worth having" when its one-sided 90% upper bound is below
    it (``paired.FUTILITY_CONFIDENCE``)."""
    verdict_pairs: int = 10
    """Window pairing: baseline/finalist window pairs per finalist, shared by the race (three
    each, then the rounds go to the leader; a finalist decided early leaves its unused pairs to
    the others), before the verdict says
    "too noisy to decide" (it stops as soon as it decides)."""
    world_sizes: list[int] = field(default_factory=list)
    """Tune each size (``--workers MIN:MAX``), an entry per size in best.yaml; []: one size."""
    scaling_baseline: bool = True
    """Measure the baseline once on a single worker, for scaling efficiency
    ``throughput(N) / (N x throughput(1))``."""
    probe: bool = False
    """Run the bandwidth probe (orchestrator.probe) once before the trials; probe.csv."""
    warm: bool = True
    """Warm evaluation: configurations with the same environment variables share one worker
    group, which rebuilds model, optimizer and data for each (false: fresh workers each)."""
    group_size: int = 16
    """Most configurations one worker group measures (warm evaluation)."""
    concurrency: int = 1
    """Worker groups measured at the same time, each on its own nodes (opt-in: on a cluster with
    more nodes than a trial needs). Trials on disjoint nodes still share the network's switches,
    which can couple their measurements."""
    cost_model_seeds: int = 3
    """Configurations the cost model ranks best, measured right after the baseline (0: none)."""
    unsafe_nccl: bool = False
    """Allow NCCL settings that NCCL says can silently corrupt data (forced LL128, relaxed PCI
    ordering, ...): in the spaces and in ``env``. A search that compares only throughput
    could otherwise write one into best.env."""
    lossy: bool = False
    """Offer knobs that change the maths (DDP gradient compression, FSDP's low reduce dtype):
    each is judged against its own declared tolerance, and reported as lossy."""

    def __post_init__(self) -> None:
        check_bounds(self, "search")
        check_choice("search.sampler", self.sampler, SAMPLERS)
        if self.windows > self.measure_steps:
            raise ConfigError(
                "search.windows",
                f"{self.windows} windows need at least as many measure_steps "
                f"(got {self.measure_steps}); raise search.measure_steps",
            )


ON_NO_SPLIT = ("wait", "fail")
TUNE_MODES = ("off", "online")
BOOL_WORDS = {"train.tune": TUNE_MODES}
"""Text keys whose words YAML reads as booleans (``off``): false and true read as these."""


@dataclass
class TrainConfig:
    """How ``orchestrator.train`` runs the configuration for real."""

    steps: int = 100
    """Optimizer steps in all; a resumed run ends at exactly this many."""
    checkpoint_every: int = 20
    snapshot_every: int | None = None
    """An in-memory snapshot every this many steps between checkpoints (and at each one), kept
    on the driver's node: a lost worker node re-does at most this many steps. Below
    checkpoint_every; null: half of it; 0: none."""
    snapshot_max_mb: float = 1024.0
    """No snapshots where the model and optimizer state weigh more than this (each snapshot
    is gathered to rank 0 and held in the driver node's memory)."""
    min_workers: int | None = None
    max_workers: int | None = None
    """Elastic range (``--workers MIN:MAX``); both null: cluster.num_workers, fixed."""
    max_failures: int = 3
    """Worker-group failures recovered from the latest checkpoint before the run gives up."""
    max_grad_norm: float = 1.0
    on_no_split: str = "wait"
    """A world size that cannot carry the global batch exactly: ``wait`` for another size
    (the elastic monitor restarts the group when the cluster changes) or ``fail``."""
    adaptive: bool = False
    """Adapt the accumulation split to the measured comm/compute ratio (opt-in)."""
    allow_global_batch_change: bool = False
    """With ``adaptive``: change the global batch (linear LR scaling, clipping with sqrt)
    instead of re-splitting it."""
    max_accumulation: int = 8
    """The most micro-batches per step ``adaptive`` or ``tune`` may choose."""
    adaptive_window: int = 10
    tune: str = "off"
    """``online``: race accumulation splits against the running one in paired windows of real
    training steps and keep one only when its interval clears 1 + ``search.verdict_delta``
    (``orchestrator.train.tune``); each world size without an entry is tuned when the run
    first trains at it."""
    tune_budget: float = 0.3
    """With ``tune``: the share of ``steps`` each world size may spend on candidate splits."""
    tune_window: int = 3
    """With ``tune``: steps a paired window holds."""
    resize_check_s: float = 10.0
    """How often Ray's elastic monitor looks for room to grow the worker group."""
    start_timeout_s: float = 30.0
    """A worker group that cannot start in this long is retried at the size the cluster has
    now (after a node loss Ray first asks for the old size: Ray's default is 60 s)."""
    first_report_timeout_s: float = 900.0
    """Watched from the driver (a frozen worker cannot run its own watchdog): a worker group
    with no report this long after its start or restart (phase ``start``: processes, imports,
    process group, model, the first ``log_every`` steps) ends the run, its workers killed
    (exit 1; ``--resume`` continues). Above ``start_timeout_s``: Ray's own retries fit in."""
    stall_timeout_s: float = 900.0
    """The same once it reported: nothing for this long after its last report (phase
    ``step``) ends the run."""
    grad_norm_every: int = 10
    log_every: int = 10

    def __post_init__(self) -> None:
        check_bounds(self, "train")
        check_choice("train.on_no_split", self.on_no_split, ON_NO_SPLIT)
        check_choice("train.tune", self.tune, TUNE_MODES)
        if self.tune != "off" and self.adaptive:
            raise ConfigError("train.tune", f"{self.tune} and train.adaptive both change the "
                              "accumulation split while training; keep one: tune measures each "
                              "change against the running split, adaptive follows the "
                              "comm/compute ratio without measuring")  # fmt: skip
        if self.snapshot_every and self.snapshot_every >= self.checkpoint_every:
            raise ConfigError(
                "train.snapshot_every",
                f"{self.snapshot_every} is not below train.checkpoint_every="
                f"{self.checkpoint_every}: snapshots come between checkpoints; set it below "
                f"{self.checkpoint_every}, or 0 for none",
            )
        if (self.min_workers is None) != (self.max_workers is None):
            raise ConfigError(
                "train.min_workers", "set both min_workers and max_workers, or neither"
            )
        if self.min_workers is not None and not 1 <= self.min_workers <= self.max_workers:
            raise ConfigError(
                "train.min_workers",
                f"need 1 <= min_workers <= max_workers, got {self.min_workers}:{self.max_workers}",
            )


@dataclass
class Config:
    """The whole configuration; ``best.yaml`` is one of these, written back out."""

    name: str = "commtune"
    """Study name; outputs go to runs/<name> unless --out is given."""
    strategy: str = "ddp"
    """``ddp``, ``fsdp`` or ``search`` (sample the strategy too)."""
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    env: dict[str, str] = field(default_factory=dict)
    """Fixed environment variables for every trial's workers (allow-listed names only)."""
    tuned: dict[str, Any] = field(default_factory=dict)
    """Parameters chosen by a search (written into best.yaml); empty means defaults."""
    sizes: dict[int, dict[str, Any]] = field(default_factory=dict)
    """A tuned entry per world size (``orchestrator.config.size_entries``): what a resized run
    switches to."""

    def __post_init__(self) -> None:
        check_name("name", self.name)
        check_choice("strategy", self.strategy, STRATEGY_MODES)
        check_tuned(self.tuned, self)
        from search_spaces import SpaceError, env_strings

        try:  # YAML true/false/null become what NCCL reads: 1/0/unset
            self.env = env_strings(self.env, self.search.unsafe_nccl)
        except SpaceError as e:
            raise ConfigError(f"env.{e.key}" if e.key else "env", e.message) from e
        per_worker, rest = divmod(self.workload.global_batch, self.cluster.num_workers)
        if rest:
            raise ConfigError(
                "workload.global_batch",
                f"{self.workload.global_batch} cannot be split over "
                f"cluster.num_workers={self.cluster.num_workers} workers; use a multiple of "
                f"{self.cluster.num_workers} "
                f"(e.g. {self.cluster.num_workers * max(1, per_worker)})",
            )
        check_split(self.tuned, per_worker, "tuned")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def from_dict(data: dict[str, Any]) -> Config:
    """Build a Config from nested plain data, rejecting unknown keys, wrong types, non-finite
    numbers and out-of-range values; then check the model and files it names (cheap first)."""
    check_finite(data, "")
    config = _build(Config, data, "")
    check_address(config.cluster.address)
    check_storage(config.search.storage)
    check_workload(config.workload)
    config.sizes = check_sizes(config)
    check_world_sizes(config)
    return config


def _build(cls: type, data: Any, prefix: str) -> Any:
    if not isinstance(data, dict):
        where = prefix.rstrip(".")
        example = f"; set its keys, e.g. --set {where}.<key>=<value>" if where else ""
        raise ConfigError(where or "<top>",
                          f"expected a mapping, got {type(data).__name__}{example}")  # fmt: skip
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f"; did you mean '{prefix}{close[0]}'?" if close else ""
            raise ConfigError(path, f"unknown key{hint} (known: {', '.join(fields)})")
        hint_type = hints[key]
        if dataclasses.is_dataclass(hint_type):
            kwargs[key] = _build(hint_type, value, f"{path}.")
        else:
            kwargs[key] = _coerce(path, value, hint_type)
    return cls(**kwargs)


def _coerce(path: str, value: Any, hint: Any) -> Any:
    """Check ``value`` against a simple type hint; ints are accepted where floats are."""
    if hint is Any:
        return value
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(path, value, inner[0])
    if origin is list:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list):
            raise ConfigError(path, f"expected a list, got {value!r}")
        return [_coerce(f"{path}[{i}]", v, typing.get_args(hint)[0]) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(path, f"expected a mapping, got {value!r}")
        return dict(value)  # env's values are converted and checked by Config
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is float and isinstance(value, str) and _FLOAT_TEXT.fullmatch(value.strip()):
        return float(value)  # YAML 1.1 reads 1e-4 (no dot, no exponent sign) as a string
    if path in BOOL_WORDS and isinstance(value, bool):
        return BOOL_WORDS[path][value]
    if hint is str and isinstance(value, bool):
        raise ConfigError(path, f"expected text, got {value!r}: YAML reads off, on, no and yes "
                          "as false and true; quote the word ('off')")  # fmt: skip
    if (hint in (int, float) and isinstance(value, bool)) or not isinstance(value, hint):
        raise ConfigError(path, f"expected {hint.__name__}, got {value!r}")
    return value


def default_preset() -> str:
    """``bert-large`` where this machine has a GPU, else the CPU demo that finishes in minutes."""
    return "bert-large" if shutil.which("nvidia-smi") else "cpu-demo"


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def load_config(
    path: str | None = None, preset: str | None = None, sets: list[str] | tuple = ()
) -> Config:
    """Preset, then file, then ``--set`` overrides; validated into a Config once."""
    return from_dict(merged(path, preset, sets))


def merged(path: str | None, preset: str | None, sets: list[str] | tuple) -> dict[str, Any]:
    """The plain data ``load_config`` validates: preset, file and overrides merged in order."""
    data: dict[str, Any] = {}
    if preset is None and path is None:
        preset = default_preset()
    if preset is not None:
        if preset not in preset_names():
            close = difflib.get_close_matches(preset, preset_names(), n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise ConfigError(
                "--preset", f"unknown preset {preset!r}; {hint}known: {', '.join(preset_names())}"
            )
        data = read_yaml(PRESET_DIR / f"{preset}.yaml", "--preset")
    if path is not None:
        data = merge(data, read_yaml(Path(path), "--config"))
    for item in sets:
        parts, value = parse_set(item)
        nested: Any = value
        for part in reversed(parts):
            nested = {part: nested}
        data = merge(data, nested)
    return data


def dump_config(config: Config) -> str:
    """YAML text of a complete config (what best.yaml holds)."""
    return yaml.safe_dump(config.to_dict(), sort_keys=False)
