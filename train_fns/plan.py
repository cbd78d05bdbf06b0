"""The TrialPlan: everything one worker group needs to run one configuration.

The driver (``orchestrator``) derives a plan from the user's config plus the
sampled parameters, checks it, and ships it to every worker as a plain dict
(``TrialPlan.to_dict``). It lives in ``train_fns`` so that the worker side never
imports the driver side: arrows point one way.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from search_spaces.knobs import BY_NAME, CHOICE, DDP, FSDP, PLAN, Knob, knobs_of, shown

ACCUMULATION, BUCKETS = "accumulation_steps", "bucket_cap_mb"
"""The knobs tuning while training switches in a live group (``train_fns.online``), named as
best.yaml's ``tuned`` names them."""

STRATEGIES = BY_NAME["strategy"].values
PRECISIONS = ("fp32", "bf16", "fp16")
TASKS = ("mlm", "clm")
FAULT_KINDS = ("crash", "hang", "oom", "corrupt")


class InfeasiblePlan(ValueError):
    """A combination that cannot run; it is rejected before any worker starts."""


def split_global_batch(global_batch: int, world_size: int, accumulation_steps: int) -> int:
    """Return the micro-batch that keeps ``global_batch`` exact, or raise InfeasiblePlan.

    ``global_batch = micro_batch * accumulation_steps * world_size`` must hold in
    every trial: the search chooses the split, never the total.
    """
    if world_size < 1 or accumulation_steps < 1 or global_batch < 1:
        raise InfeasiblePlan(
            f"global_batch={global_batch}, world_size={world_size} and "
            f"accumulation_steps={accumulation_steps} must all be >= 1"
        )
    per_step = world_size * accumulation_steps
    if global_batch % per_step:
        raise InfeasiblePlan(
            f"global_batch={global_batch} is not divisible by world_size={world_size} x "
            f"accumulation_steps={accumulation_steps} (= {per_step}); "
            "pick an accumulation that divides global_batch / world_size"
        )
    return global_batch // per_step


def window_lengths(measure_steps: int, num_windows: int) -> list[int]:
    """Each measured window's steps: ``measure_steps`` split into ``num_windows`` windows that
    differ by at most one step when it does not divide evenly (the longer ones first)."""
    base, extra = divmod(measure_steps, num_windows)
    return [base + (1 if window < extra else 0) for window in range(num_windows)]


def steps_per_window(measure_steps: int, num_windows: int) -> int:
    """The steps of one window as the driver plans with them: the shortest window's (every
    window has at least these), at least one."""
    return max(1, window_lengths(measure_steps, num_windows)[-1])


def resplit(global_batch: int, world_size: int, max_micro_batch: int) -> tuple[int, int] | None:
    """``(accumulation_steps, micro_batch)`` for a new world size, global batch unchanged.

    The tuned micro-batch shapes memory, so the new one is the largest that divides exactly
    and does not exceed it (fewest accumulation steps); None when no split exists (the world
    size does not divide the global batch).
    """
    if world_size < 1 or global_batch % world_size:
        return None
    per_rank = global_batch // world_size
    for accumulation in range(1, per_rank + 1):
        if per_rank % accumulation == 0 and per_rank // accumulation <= max_micro_batch:
            return accumulation, per_rank // accumulation
    return None


def with_world_size(plan: TrialPlan, world_size: int) -> TrialPlan:
    """``plan`` on ``world_size`` workers with the same micro-batch, accumulation raised (or
    lowered) to keep the global batch: what a scaling comparison needs, since a different
    micro-batch runs different kernels, and the whole global batch in one micro-step may not
    fit one GPU. Raises InfeasiblePlan when ``world_size x micro_batch`` does not divide it.
    """
    per_step = world_size * plan.micro_batch
    if world_size < 1 or plan.global_batch % per_step:
        raise InfeasiblePlan(
            f"global_batch={plan.global_batch} is not a multiple of world_size={world_size} x "
            f"micro_batch={plan.micro_batch}"
        )
    accumulation = plan.global_batch // per_step
    return dataclasses.replace(plan, world_size=world_size, accumulation_steps=accumulation)


def _options(name: str, home: str, doc: str) -> type:
    """A frozen dataclass with one field per knob of ``home`` in the registry, torch's default
    as its default: the registry is the one list of a plan's DDP and FSDP options."""
    fields = [(k.name, k.kind, field(default=k.default)) for k in knobs_of(home)]
    namespace = {"__doc__": doc, "__module__": __name__}
    return dataclasses.make_dataclass(name, fields, frozen=True, namespace=namespace)


DDPOptions = _options(
    "DDPOptions",
    DDP,
    "Knobs of ``torch.nn.parallel.DistributedDataParallel`` (the registry's "
    "``ddp`` knobs, ``search_spaces.knobs``); defaults are torch's.",
)
FSDPOptions = _options(
    "FSDPOptions",
    FSDP,
    "Knobs of FSDP2 ``fully_shard`` (the registry's ``fsdp`` knobs, "
    "``search_spaces.knobs``); defaults are torch's.",
)


def model_knobs(knobs: dict[str, Any], unused_parameters: bool | None) -> dict[str, Any]:
    """``knobs`` as the model needs them: one whose steps leave parameters unused runs DDP with
    ``find_unused_parameters`` whatever was tuned (without it, DDP's reducer stops the run)."""
    if not unused_parameters:
        return knobs
    # static_graph assumes the same parameters get gradients every step
    return {**knobs, "find_unused_parameters": True, "static_graph": False}


def options_from_knobs(knobs: dict[str, Any]) -> tuple[DDPOptions, FSDPOptions]:
    """The DDP and FSDP options named in ``knobs`` (best.yaml's ``tuned``, a trial's sampled
    params); the others keep torch's defaults. A bucket size is MB as a float, whatever YAML
    made of it."""
    out = []
    for cls, home in ((DDPOptions, DDP), (FSDPOptions, FSDP)):
        values = {k.name: _as_kind(k, knobs[k.name]) for k in knobs_of(home) if k.name in knobs}
        out.append(cls(**values))
    return out[0], out[1]


def _as_kind(knob: Knob, value: Any) -> Any:
    """A float knob's value as a float, whatever YAML made of it (``bucket_cap_mb: 50``)."""
    return float(value) if knob.kind is float else value


def knob_fields(knobs: dict[str, Any], unused_parameters: bool | None, strategy: str) -> dict:
    """The TrialPlan fields that tuned ``knobs`` set (the rest keep torch's defaults), with
    ``strategy`` where the knobs name none: one mapping for a config's plan, a fitted entry's
    and the tuned result in a user's own loop."""
    ddp, fsdp = options_from_knobs(model_knobs(knobs, unused_parameters))
    own = {k.name: knobs.get(k.name, k.default) for k in knobs_of(PLAN)}
    del own["accumulation_steps"]  # the split: derived with the micro-batch, never copied
    return {**own, "strategy": str(knobs.get("strategy", strategy)), "ddp": ddp, "fsdp": fsdp}


@dataclass(frozen=True)
class TrialPlan:
    """One configuration, fully derived and checked; what a worker runs."""

    model: str
    """A preset name (``bert-tiny``), an HF model type (``roberta``) or a local directory;
    with ``entrypoint``, only a label."""
    task: str | None
    seq_len: int
    global_batch: int
    world_size: int
    accumulation_steps: int
    micro_batch: int
    strategy: str = BY_NAME["strategy"].default
    precision: str = "fp32"
    ddp: DDPOptions = field(default_factory=DDPOptions)
    fsdp: FSDPOptions = field(default_factory=FSDPOptions)
    activation_checkpointing: bool = BY_NAME["activation_checkpointing"].default
    adamw_impl: str | None = BY_NAME["adamw_impl"].default
    """The registry's knobs of the plan itself (``search_spaces.knobs``, home ``plan``) are
    fields here, with its defaults."""
    model_overrides: dict[str, Any] = field(default_factory=dict)
    """Keys passed to the HF config (e.g. ``num_hidden_layers``) after the preset's."""
    data: str = "synthetic"
    """``synthetic`` or a path to a local .txt/.jsonl file."""
    tokenizer: str | None = None
    """Local tokenizer directory for file data; defaults to the model directory."""
    use_gpu: bool = False
    lr: float = 1e-4
    seed: int = 0
    warmup_steps: int = 3
    measure_steps: int = 12
    num_windows: int = 3
    """Measured steps are split into this many windows; each window is reported."""
    step_deadline_s: float = 300.0
    """A worker that finishes no step for this long is hung: it is ended, not waited for."""
    env_names: tuple[str, ...] = ()
    """Environment variables whose values the worker echoes back (what it really saw)."""
    marker_dir: str | None = None
    """Where a worker's watchdog leaves a hang marker before ending itself (driver reads it)."""
    unused_parameters: bool = False
    """The model's steps leave parameters unused (workload.unused_parameters): DDP runs with
    ``find_unused_parameters``, FSDP2 as one unit with ``train_fns.unused``."""
    fault: str | None = None
    """Testing aid: ``crash``, ``hang`` or ``oom`` makes one worker fail that way; ``corrupt``
    perturbs one worker's gradients after the all-reduce of the first step."""
    max_grad_norm: float | None = None
    """Clip gradients to this norm and skip a step whose norm is not finite (training runs;
    the search leaves it off so trials time exactly the step a user would run)."""
    prune_below: float | None = None
    """Global samples/s below which this configuration is clearly slower than the best so
    far: after two windows below it the workers stop measuring it (None: never)."""
    entrypoint: str | None = None
    """The user's workload (``file.py:make_workload`` or ``pkg.module:make_workload``); None:
    the built-in Hugging Face model."""
    options: dict[str, Any] = field(default_factory=dict)
    """``workload.options``, passed to the user's ``make_workload`` as ``ctx.options``."""
    workload_source: str | None = None
    """A file entrypoint's text, read once on the driver: workers on any node run it."""
    resident: str | None = None
    """A key (paired windows, ``orchestrator.search.race``): the model, optimizer and data this
    plan builds stay alive in its worker group after it ends, and a later plan with the same key
    measures on them, without a rebuild, its ``warmup_steps`` then the steps after a switch.
    Several residents alternate window by window in the same processes. None: freed at its end."""
    first_step: int = 0
    first_sample: int = 0
    """The data position: step ``first_step`` starts at global sample ``first_sample``. A
    training run that resumes, or changes its split, continues the stream exactly."""

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise InfeasiblePlan(f"precision={self.precision!r}; use one of {PRECISIONS}")
        if self.task is not None and self.task not in TASKS:
            raise InfeasiblePlan(f"task={self.task!r}; use one of {TASKS}")
        if self.fault is not None and self.fault not in FAULT_KINDS:
            raise InfeasiblePlan(f"fault={self.fault!r}; use one of {FAULT_KINDS}")
        micro = split_global_batch(self.global_batch, self.world_size, self.accumulation_steps)
        if micro != self.micro_batch:
            raise InfeasiblePlan(
                f"micro_batch={self.micro_batch} breaks the global batch: "
                f"{self.global_batch} / ({self.world_size} x {self.accumulation_steps}) = {micro}"
            )
        if self.precision == "fp16" and not self.use_gpu:
            raise InfeasiblePlan(
                "precision=fp16 needs GPUs (fp16 autocast and GradScaler are CUDA features); "
                "use bf16 or fp32 on CPU workers"
            )
        if self.strategy == "ddp" and self.ddp.static_graph and self.accumulation_steps > 1:
            # torch's no_sync() under static_graph asserts in the reducer on the first
            # backward (expect_autograd_hooks_), pytorch/pytorch#143580; see also #187732.
            raise InfeasiblePlan(
                "ddp.static_graph=True with accumulation_steps > 1 fails in torch's DDP "
                "(no_sync under static_graph, pytorch#143580); use static_graph=False "
                "or accumulation_steps=1"
            )
        self._check_knobs()
        if self.measure_steps < self.num_windows or self.num_windows < 1:
            raise InfeasiblePlan(
                f"measure_steps={self.measure_steps} must be >= num_windows={self.num_windows} >= 1"
            )

    def _check_knobs(self) -> None:
        """The DDP/FSDP/optimizer knobs: values torch accepts, in combinations that run."""
        for knob in (k for k in BY_NAME.values() if k.takes == CHOICE):
            where = self if knob.home == PLAN else getattr(self, knob.home)
            value = getattr(where, knob.name)
            if value not in knob.values:
                where = knob.name if knob.home == PLAN else f"{knob.home}.{knob.name}"
                raise InfeasiblePlan(f"{where}={value!r}; use one of {shown(knob.values)}")
        checks = (
            (self.fsdp.reduce_dtype in ("fp32", self.precision), f"fsdp.reduce_dtype="
             f"{self.fsdp.reduce_dtype!r} under precision={self.precision}; use fp32"
             + ("" if self.precision == "fp32" else f" or {self.precision}")),
            (self.ddp.comm_hook != "bf16" or self.use_gpu, "ddp.comm_hook=bf16 needs GPUs "
             "(torch registers it on CUDA with NCCL >= 2.10 only); use fp16 on gloo"),
            (self.adamw_impl != "fused" or self.use_gpu, "adamw_impl=fused needs GPUs "
             "(torch's fused AdamW is searched on CUDA only); use foreach or null on CPU"),
        )  # fmt: skip
        for ok, why in checks:
            if not ok:
                raise InfeasiblePlan(why)
        reshard = self.fsdp.reshard_after_forward
        if not isinstance(reshard, bool) and not (
            isinstance(reshard, int) and 1 < reshard < self.world_size
            and self.world_size % reshard == 0
        ):  # fmt: skip
            raise InfeasiblePlan(
                f"fsdp.reshard_after_forward={reshard!r} on {self.world_size} workers; an "
                "integer must divide the world size and lie strictly between 1 and it"
            )
        if self.fsdp.hsdp and not isinstance(reshard, bool):
            raise InfeasiblePlan(
                f"fsdp.hsdp with reshard_after_forward={reshard}: HSDP shards within a node, "
                "so a smaller reshard group is not searched; use true or false with HSDP"
            )

    def nccl_reductions(self) -> list[tuple[str, str, str, str]]:
        """The reductions torch issues on the training communicator for this plan, as
        (collective, operation, dtype, who): what a forced NCCL algorithm must be able to run.
        commtune's own figures and agreements go over a gloo side group (``ranks.side_group``).
        FSDP2 (torch 2.13, ``_get_gradient_divide_factors``) reduces with Avg on NCCL, or with
        Sum and its own divides for fp16."""
        if self.strategy == "ddp":
            grads = self.ddp.comm_hook or "fp32"  # the parameters stay fp32 under autocast
            found = [("AllReduce", "sum", grads, "DDP's gradient all-reduce")]
            if self.ddp.find_unused_parameters:
                used_map = "DDP's map of the parameters a step used"
                found.append(("AllReduce", "sum", "int32", used_map))
            return found
        low = self.precision in ("bf16", "fp16")
        reduce = self.fsdp.reduce_dtype if low else "fp32"
        op = "sum" if reduce == "fp16" else "avg"
        found = [("ReduceScatter", op, reduce, "FSDP2's gradient reduce-scatter")]
        if self.fsdp.hsdp:
            found.append(("AllReduce", op, reduce, "HSDP's all-reduce across replicas"))
        if self.precision == "fp16":
            found.append(("AllReduce", "max", "fp32", "GradScaler's overflow check over shards"))
        return found

    def lossy(self) -> list[str]:
        """The lossy knobs this plan runs (``ddp.comm_hook=bf16``): they change the maths, so
        the guard judges them against their own declared tolerance."""
        found = []
        if self.strategy == "ddp" and self.ddp.comm_hook is not None:
            found.append(f"ddp.comm_hook={self.ddp.comm_hook}")
        if self.strategy == "fsdp" and self.fsdp.reduce_dtype != "fp32":
            found.append(f"fsdp.reduce_dtype={self.fsdp.reduce_dtype}")
        return found

    @property
    def total_steps(self) -> int:
        return self.warmup_steps + self.measure_steps

    def to_dict(self) -> dict[str, Any]:
        """A plain, picklable and JSON-able dict (what ``train_loop_config`` carries)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialPlan:
        data = dict(data)
        data["ddp"] = DDPOptions(**data.get("ddp", {}))
        data["fsdp"] = FSDPOptions(**data.get("fsdp", {}))
        data["env_names"] = tuple(data.get("env_names", ()))
        return cls(**data)
