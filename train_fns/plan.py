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

STRATEGIES = ("ddp", "fsdp")
PRECISIONS = ("fp32", "bf16", "fp16")
TASKS = ("mlm", "clm")
FAULT_KINDS = ("crash", "hang", "oom", "corrupt")
COMM_HOOKS = ("bf16", "fp16")
"""DDP gradient compression hooks (torch's ``default_hooks``): lossy, searched on opt-in only."""
REDUCE_DTYPES = ("fp32", "bf16", "fp16")
ADAMW_IMPLS = ("foreach", "fused")
"""AdamW's implementation (None: torch's choice); ``fused`` runs on CUDA only."""


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


@dataclass(frozen=True)
class DDPOptions:
    """Knobs of ``torch.nn.parallel.DistributedDataParallel``; defaults are torch's."""

    bucket_cap_mb: float = 25.0
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    broadcast_buffers: bool = True
    """Broadcast rank 0's buffers before every forward (BERT's position ids): exact when no
    buffer changes in training, which is what the guard checks."""
    comm_hook: str | None = None
    """``bf16``/``fp16``: compress gradients for the all-reduce (lossy); None: full precision."""
    find_unused_parameters: bool = False
    """Let DDP's reducer find the parameters a step leaves without a gradient (a mixture of
    experts, a conditional branch): needed by such models, exact, a graph walk per step."""


@dataclass(frozen=True)
class FSDPOptions:
    """Knobs of FSDP2 ``fully_shard``; defaults are torch's."""

    reshard_after_forward: bool | int = True
    """An int reshards to that many ranks after forward (a non-trivial divisor of the shard
    group): backward all-gathers within the smaller group."""
    reduce_dtype: str = "fp32"
    """The gradient reduce-scatter's dtype under bf16/fp16 parameters; the low one is lossy."""
    forward_prefetch: int = 0
    """All-gather this many next blocks ahead in forward (0: FSDP2's implicit schedule)."""
    backward_prefetch: int = 0
    """All-gather this many previous blocks ahead in backward (0: FSDP2's implicit one)."""
    hsdp: bool = False
    """Replicate across nodes, shard within one (a 2-D mesh from the ranks' local world)."""


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
    for cls in (DDPOptions, FSDPOptions):
        values = {f.name: knobs[f.name] for f in dataclasses.fields(cls) if f.name in knobs}
        if "bucket_cap_mb" in values:
            values["bucket_cap_mb"] = float(values["bucket_cap_mb"])
        out.append(cls(**values))
    return out[0], out[1]


def knob_fields(knobs: dict[str, Any], unused_parameters: bool | None, strategy: str) -> dict:
    """The TrialPlan fields that tuned ``knobs`` set (the rest keep torch's defaults), with
    ``strategy`` where the knobs name none: one mapping for a config's plan, a fitted entry's
    and the tuned result in a user's own loop."""
    ddp, fsdp = options_from_knobs(model_knobs(knobs, unused_parameters))
    return {
        "strategy": str(knobs.get("strategy", strategy)), "ddp": ddp, "fsdp": fsdp,
        "activation_checkpointing": bool(knobs.get("activation_checkpointing", False)),
        "adamw_impl": knobs.get("adamw_impl"),
    }  # fmt: skip


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
    strategy: str = "ddp"
    precision: str = "fp32"
    ddp: DDPOptions = field(default_factory=DDPOptions)
    fsdp: FSDPOptions = field(default_factory=FSDPOptions)
    activation_checkpointing: bool = False
    adamw_impl: str | None = None
    """``foreach`` or ``fused`` AdamW (the default optimizer only); None: torch's choice."""
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
        if self.strategy not in STRATEGIES:
            raise InfeasiblePlan(f"strategy={self.strategy!r}; use one of {STRATEGIES}")
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
        checks = (
            (self.ddp.comm_hook in (None, *COMM_HOOKS), f"ddp.comm_hook={self.ddp.comm_hook!r}; "
             f"use null or one of {COMM_HOOKS}"),
            (self.fsdp.reduce_dtype in ("fp32", self.precision), f"fsdp.reduce_dtype="
             f"{self.fsdp.reduce_dtype!r} under precision={self.precision}; use fp32"
             + ("" if self.precision == "fp32" else f" or {self.precision}")),
            (self.adamw_impl in (None, *ADAMW_IMPLS), f"adamw_impl={self.adamw_impl!r}; use "
             f"null or one of {ADAMW_IMPLS}"),
            (self.ddp.comm_hook != "bf16" or self.use_gpu, "ddp.comm_hook=bf16 needs GPUs "
             "(torch registers it on CUDA with NCCL >= 2.10 only); use fp16 on gloo"),
            (self.adamw_impl != "fused" or self.use_gpu, "adamw_impl=fused needs GPUs "
             "(torch's fused AdamW is searched on CUDA only); use foreach or null on CPU"),
            (all(0 <= d <= 8 for d in (self.fsdp.forward_prefetch, self.fsdp.backward_prefetch)),
             "fsdp.forward_prefetch and fsdp.backward_prefetch must be 0 to 8 blocks"),
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
