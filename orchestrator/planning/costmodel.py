"""Alpha-beta cost model of data-parallel communication: bytes, time, and a dry-run ranking.

A trial measures what happened; this model says what the link allows, so exposed communication
can be judged against a bound, DDP vs FSDP traffic explained in bytes, and candidate configs
ranked without a cluster: each trial's bound (``comm_bound``), the dry run, the cost-model
seeds of the search and the doctor's bandwidth rule all price traffic here.
A message of m bytes costs ``alpha + m * beta`` (alpha: latency, s;
beta = 1 / bandwidth, s/byte). Bytes, seconds, bytes/s, GB = 1e9 bytes as nccl-tests reports;
``size_bytes`` is always the whole (unsharded) buffer, as nccl-tests counts it; one rank moves
nothing. Pure Python so the driver can use it before Ray or torch start.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from train_fns.metrics import FLOPS_PER_PARAM_TOKEN, OPS
from train_fns.plan import STRATEGIES, DDPOptions

ALGORITHMS = ("ring", "tree")
GRAD_BYTES_PER_PARAM = 4
"""Gradients are fp32 (autocast keeps fp32 parameters): what DDP all-reduces per parameter."""


DEFAULT_BUCKET_BYTES = int(DDPOptions.bucket_cap_mb * 2**20)
"""The plan's (torch DDP's) ``bucket_cap_mb=25``; torch multiplies by 1024 * 1024, so MiB."""
LOW_PRECISIONS = ("bf16", "fp16")
"""Precisions under which FSDP2 gathers parameters in 2 bytes (its ``param_dtype``)."""

BACKWARD_SHARE = 2 / 3
"""Backward's share of a micro-step's compute (about twice the forward's FLOPs): the window
DDP's gradient all-reduce can hide behind."""


@dataclass(frozen=True)
class Link:
    """What one rank sees of the interconnect, in alpha-beta terms."""

    bandwidth_bytes_per_s: float
    """Bus bandwidth (nccl-tests' busbw of a large all-reduce): with it, beta = 1 / bandwidth makes
    the ring formula reproduce busbw exactly, so a probe's figure can be dropped in as is."""
    latency_s: float
    """alpha: the fixed cost of one step of one message."""
    name: str = "custom"

    def __post_init__(self) -> None:
        if not self.bandwidth_bytes_per_s > 0:
            raise ValueError(f"Link {self.name}: bandwidth_bytes_per_s must be > 0")
        if not self.latency_s >= 0:
            raise ValueError(f"Link {self.name}: latency_s must be >= 0")

    @property
    def beta(self) -> float:
        return 1.0 / self.bandwidth_bytes_per_s


# Nominal figures for the motivating clusters (vendor line rates and typical nccl-tests results),
# not measurements: replace them with a measured all-reduce busbw and small-message latency
# (e.g. from nccl-tests) before trusting a prediction.
PCIE_V100 = Link(12e9, 10e-6, "pcie_v100")  # 4 x V100 over PCIe 3.0 x16 (15.75 GB/s raw)
NVLINK_A100 = Link(150e9, 5e-6, "nvlink_a100")  # 8 x A100, NVLink 3 through NVSwitch
NET_100G = Link(12.5e9, 20e-6, "net_100g")  # 100 Gb/s between nodes
EFA_400G = Link(50e9, 30e-6, "efa_400g")  # p4d: 4 x 100 Gb/s EFA per node
# gloo between 2 CPU workers on one 2-core machine: this project's probe measured an all-reduce
# busbw of 1.40 GB/s at 64 MiB; 100 us stands for a loopback TCP round trip.
LOOPBACK_GLOO = Link(1.4e9, 100e-6, "loopback_gloo")
LINKS = {link.name: link for link in (PCIE_V100, NVLINK_A100, NET_100G, EFA_400G, LOOPBACK_GLOO)}


def _check(op: str, algorithm: str, n: int) -> None:
    if op not in OPS:
        raise ValueError(f"unknown collective {op!r}; use one of {OPS}")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; use one of {ALGORITHMS}")
    if algorithm == "tree" and op != "all_reduce":
        raise ValueError(f"NCCL has no tree {op}; use algorithm='ring'")
    if n < 1:
        raise ValueError(f"n={n}: a collective needs at least one rank")


def latency_steps(op: str, n: int, algorithm: str = "ring") -> int:
    """Sequential steps of one message, each paying alpha once.

    Ring all-reduce is a reduce-scatter then an all-gather, n - 1 steps each; the double binary
    tree goes up and down a tree of depth ceil(log2 n).
    """
    _check(op, algorithm, n)
    if op != "all_reduce":
        return n - 1
    if algorithm == "ring":
        return 2 * (n - 1)
    return 2 * (n - 1).bit_length()  # (n - 1).bit_length() == ceil(log2 n) for n >= 1


def bytes_per_rank(op: str, size_bytes: float, n: int, algorithm: str = "ring") -> float:
    """Bytes each rank sends for one collective on a ``size_bytes`` buffer.

    Ring: each of the 2(n - 1) (all-reduce) or n - 1 steps moves a chunk of S / n. Tree: a
    pipelined approximation of NCCL's double binary tree (each tree carries half the buffer up to
    the parent, reducing, then down to the children): about 2S per rank, independent of n. It
    ignores the pipeline fill (chunks times depth), which matters only for small messages.
    """
    _check(op, algorithm, n)
    if n == 1:
        return 0.0
    if op == "all_reduce":
        return 2 * (n - 1) / n * size_bytes if algorithm == "ring" else 2.0 * size_bytes
    return (n - 1) / n * size_bytes


def collective_time(
    op: str,
    size_bytes: float,
    n: int,
    link: Link,
    algorithm: str = "ring",
    num_messages: int = 1,
) -> float:
    """Predicted seconds for one collective on ``size_bytes`` split into ``num_messages``.

    Splitting (DDP buckets, FSDP units) leaves the bandwidth term alone and multiplies the latency
    term: ``num_messages * latency_steps * alpha + bytes_per_rank * beta``.
    """
    if num_messages < 1:
        raise ValueError(f"num_messages={num_messages} must be >= 1")
    steps = latency_steps(op, n, algorithm)
    return (
        num_messages * steps * link.latency_s
        + bytes_per_rank(op, size_bytes, n, algorithm) * link.beta
    )


def bus_factor(op: str, n: int) -> float:
    """busbw / algbw for ``op`` on ``n`` ranks, so a probe can scale a measured algbw directly.

    The share of the buffer each rank's link carries: 2(n - 1) / n for all-reduce (a
    reduce-scatter then an all-gather), (n - 1) / n for all-gather and reduce-scatter; 0 on one
    rank, which moves nothing.
    """
    _check(op, "ring", n)
    return 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


@dataclass(frozen=True)
class ModelSize:
    """How much a model weighs on the wire."""

    num_params: int
    num_layers: int = 0
    """Transformer blocks: commtune shards one FSDP unit per block plus the root
    (train_fns.strategies), so FSDP sends ``num_layers + 1`` messages per collective."""
    name: str = "custom"

    @property
    def num_fsdp_units(self) -> int:
        return self.num_layers + 1

    @classmethod
    def bert_large(cls) -> ModelSize:
        """BERT-large: about 335M parameters (1.34e9 bytes of fp32 gradients), 24 blocks."""
        return cls(num_params=335_000_000, num_layers=24, name="bert-large")


@dataclass(frozen=True)
class Collective:
    """One kind of collective in an optimizer step, with its totals over that step."""

    op: str
    size_bytes: int  # the whole buffer of one call: every parameter or gradient
    num_calls: int  # per optimizer step
    num_messages: int  # per call (DDP buckets, FSDP units), each paying the latency term
    bytes_per_rank: float  # all calls of the step
    time_s: float  # all calls of the step
    message_s: float  # one message of one call: what cannot hide behind compute


@dataclass(frozen=True)
class StepTraffic:
    """Communication of one optimizer step, per rank."""

    strategy: str
    world_size: int
    link: Link
    collectives: tuple[Collective, ...]

    @property
    def bytes_per_rank(self) -> float:
        return sum(c.bytes_per_rank for c in self.collectives)

    @property
    def comm_s(self) -> float:
        return sum(c.time_s for c in self.collectives)

    @property
    def num_messages(self) -> int:
        return sum(c.num_calls * c.num_messages for c in self.collectives)

    def summary(self) -> str:
        parts = ", ".join(f"{c.op} x{c.num_calls}" for c in self.collectives)
        return (
            f"{self.strategy} on {self.world_size} ranks: {self.bytes_per_rank / 1e9:.3g} GB per "
            f"rank per step in {self.num_messages} messages ({parts}), "
            f"{self.comm_s * 1e3:.3g} ms on {self.link.name}"
        )


def _collective(
    op: str, size: int, n: int, link: Link, algorithm: str, calls: int, messages: int
) -> Collective:
    return Collective(
        op=op,
        size_bytes=size,
        num_calls=calls,
        num_messages=messages,
        bytes_per_rank=calls * bytes_per_rank(op, size, n, algorithm),
        time_s=calls * collective_time(op, size, n, link, algorithm, messages),
        message_s=collective_time(op, size / messages, n, link, algorithm),
    )


def comm_per_step(
    strategy: str,
    num_params: int,
    dtype_bytes: int,
    world_size: int,
    accumulation_steps: int,
    reshard_after_forward: bool,
    link: Link,
    algorithm: str = "ring",
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    *,
    num_fsdp_units: int = 1,
    gather_bytes: int | None = None,
) -> StepTraffic:
    """Bytes each rank moves, and the time it takes, in one optimizer step.

    What is counted:

    - DDP: one all-reduce of all gradients per optimizer step, whatever ``accumulation_steps``
      (earlier micro-steps run under ``no_sync``), in ``ceil(grad_bytes / bucket_bytes)`` buckets,
      each paying the latency term. ``algorithm`` chooses ring or tree for it. Torch's small first
      bucket and bucket edges falling on parameter boundaries are ignored.
    - FSDP (FULL_SHARD semantics of FSDP2): per micro-step, an all-gather of the parameters in
      forward and, with ``reshard_after_forward``, another in backward; one reduce-scatter of the
      gradients per optimizer step (``set_requires_gradient_sync(False)`` keeps unsharded
      gradients on the earlier micro-steps). Always ring: NCCL has no tree for these. Each call is
      ``num_fsdp_units`` messages. The root unit, which FSDP2 never reshards after forward, is
      counted like the others.

    So without accumulation FSDP moves 3(n-1)/n*S with resharding and 2(n-1)/n*S without, against
    DDP's 2(n-1)/n*S: 1.5x and 1x. The common rule of thumb says about twice (4x vs 2x the
    gradient size), which is what counting FSDP's gradient sync as a full all-reduce (2S) would
    give; FSDP only reduce-scatters (S). Accumulation a makes FSDP's ratio grow to (2a + 1) / 2
    with resharding, since its all-gathers repeat every micro-step. ``dtype_bytes`` is the
    gradients' (reductions stay fp32); ``gather_bytes`` the parameters' all-gather dtype (2 under
    a bf16/fp16 ``param_dtype``, which halves the gathers only; default ``dtype_bytes``).
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; use one of {STRATEGIES}")
    counts = dict(num_params=num_params, dtype_bytes=dtype_bytes, world_size=world_size)
    counts.update(accumulation_steps=accumulation_steps, bucket_bytes=bucket_bytes)
    for key, value in dict(counts, num_fsdp_units=num_fsdp_units).items():
        if value < 1:
            raise ValueError(f"{key}={value} must be >= 1")
    payload = num_params * dtype_bytes
    n = world_size
    if strategy == "ddp":
        num_buckets = -(-payload // bucket_bytes)  # ceil without float rounding
        parts = (_collective("all_reduce", payload, n, link, algorithm, 1, num_buckets),)
    else:
        gathers = accumulation_steps * (2 if reshard_after_forward else 1)
        gathered = num_params * (gather_bytes or dtype_bytes)
        parts = (
            _collective("all_gather", gathered, n, link, "ring", gathers, num_fsdp_units),
            _collective("reduce_scatter", payload, n, link, "ring", 1, num_fsdp_units),
        )
    return StepTraffic(strategy=strategy, world_size=n, link=link, collectives=parts)


def knob_traffic(
    knobs: Mapping[str, Any],
    model: ModelSize,
    world_size: int,
    link: Link,
    *,
    precision: str = "fp32",
    dtype_bytes: int = GRAD_BYTES_PER_PARAM,
    algorithm: str = "ring",
) -> StepTraffic:
    """One optimizer step's traffic under ``knobs`` (a candidate, a trial's plan): the one
    place a configuration becomes :func:`comm_per_step`'s arguments, so a ranking, a dry run
    and a trial's bound price the same bytes. A missing knob (or a ``None`` bucket size) is the
    plan's default; ``precision`` sets FSDP's all-gather dtype."""
    bucket_mb = knobs.get("bucket_cap_mb") or DEFAULT_BUCKET_BYTES / 2**20
    return comm_per_step(
        knobs.get("strategy", "ddp"), model.num_params, dtype_bytes, world_size,
        int(knobs.get("accumulation_steps", 1)), bool(knobs.get("reshard_after_forward", True)),
        link, algorithm, int(float(bucket_mb) * 2**20), num_fsdp_units=model.num_fsdp_units,
        gather_bytes=2 if precision in LOW_PRECISIONS else None,
    )  # fmt: skip


def exposed_comm_s(compute_s: float, comm_s: float, overlap: float) -> float:
    """Communication left on the critical path: ``max(0, comm - overlap * compute)``."""
    if not 0.0 <= overlap <= 1.0:
        raise ValueError(f"overlap={overlap} must be within [0, 1]")
    return max(0.0, comm_s - overlap * compute_s)


def predict_step_time(compute_s: float, comm_s: float, overlap: float) -> float:
    """The usual ``step = max(compute, comm) + sync_overhead``, the overhead made explicit.

    ``overlap`` is the fraction of compute that communication can run behind. The step is compute
    plus exposed communication, which equals ``max(compute, comm)`` plus a sync overhead of
    ``min(compute, comm) - min(comm, overlap * compute)``: 0 with perfect overlap, the smaller of
    the two with none (then the step is ``compute + comm``).
    """
    return compute_s + exposed_comm_s(compute_s, comm_s, overlap)


def predict_throughput(
    candidate: Mapping[str, Any],
    model: ModelSize,
    world_size: int,
    link: Link,
    compute_s_per_sample: float,
    *,
    global_batch: int,
    precision: str = "fp32",
    dtype_bytes: int = GRAD_BYTES_PER_PARAM,
    algorithm: str = "ring",
) -> float:
    """Predicted global samples/s of one candidate; see ``rank_candidates`` for the model."""
    if not compute_s_per_sample > 0 or global_batch < 1:
        raise ValueError(
            f"compute_s_per_sample={compute_s_per_sample} must be > 0 and "
            f"global_batch={global_batch} >= 1"
        )
    strategy = candidate.get("strategy", "ddp")
    accumulation = int(candidate.get("accumulation_steps", 1))
    traffic = knob_traffic(candidate, model, world_size, link, precision=precision,
                           dtype_bytes=dtype_bytes, algorithm=algorithm)  # fmt: skip
    compute_s = compute_s_per_sample * global_batch / world_size  # the same for any split
    if strategy == "ddp":
        window_s = BACKWARD_SHARE * compute_s / accumulation  # the last micro-step's backward
        tail_s = traffic.collectives[0].message_s  # the last bucket is ready when backward ends
    else:
        window_s = compute_s  # all-gathers are prefetched a unit ahead in forward and backward
        gather, scatter = traffic.collectives
        tail_s = accumulation * gather.message_s + scatter.message_s  # first gather, last scatter
    step_s = predict_step_time(compute_s, traffic.comm_s, window_s / compute_s)
    step_s = max(step_s, compute_s + min(tail_s, traffic.comm_s))
    return global_batch / step_s


def rank_candidates(
    candidates: list[dict[str, Any]],
    model: ModelSize,
    world_size: int,
    link: Link,
    compute_s_per_sample: float,
    *,
    global_batch: int,
    precision: str = "fp32",
    dtype_bytes: int = GRAD_BYTES_PER_PARAM,
    algorithm: str = "ring",
) -> list[tuple[float, dict[str, Any]]]:
    """Rank candidate configs by predicted samples/s, best first, without a cluster.

    A candidate is a dict with ``strategy`` (ddp), ``accumulation_steps`` (1), ``bucket_cap_mb``
    (25, MiB as torch reads it) and ``reshard_after_forward`` (True); other keys (NCCL variables,
    ...) are ignored and ties keep input order. The global batch is fixed, so each rank computes
    ``compute_s_per_sample * global_batch / world_size`` per step whatever the split; compute per
    sample is taken as independent of micro-batch size, and memory is not modelled (an OOM is for
    a trial to find), so accumulation never helps here: it only shrinks DDP's overlap window.

    Overlap: DDP's all-reduce runs behind the backward of the last micro-step, and its last
    bucket is always exposed; FSDP's all-gathers are prefetched behind all compute, and its first
    all-gather per micro-step and its last reduce-scatter are exposed.
    """
    setting = (model, world_size, link, compute_s_per_sample)
    options = {"global_batch": global_batch, "precision": precision, "dtype_bytes": dtype_bytes,
               "algorithm": algorithm}  # fmt: skip
    ranked = [(predict_throughput(c, *setting, **options), c) for c in candidates]
    ranked.sort(key=lambda pair: -pair[0])  # sort is stable: ties keep input order
    return ranked


def link_from_probe(rows: list[dict[str, Any]]) -> Link | None:
    """The link a probe measured: the bus bandwidth of its largest all-reduce, and the latency
    of its smallest divided by that all-reduce's sequential steps (None: no all-reduce rows, or
    a probe of one rank)."""
    reduce = sorted(
        (r for r in rows if r.get("op") == "all_reduce"), key=lambda r: float(r["size_bytes"])
    )
    if not reduce:
        return None
    n = int(reduce[0]["world_size"])
    bandwidth = float(reduce[-1]["busbw_gbps"]) * 1e9
    if n < 2 or bandwidth <= 0:
        return None  # one rank moves nothing: its bus bandwidth is 0, not a link
    latency = float(reduce[0]["time_s"]) / max(1, latency_steps("all_reduce", n))
    return Link(bandwidth, latency, f"probe ({reduce[0].get('backend', '?')})")


def compute_s_per_sample(num_params: int, seq_len: int, tflops: float) -> float:
    """Seconds of compute per sample at ``tflops`` achieved: 6 x params x tokens FLOPs."""
    return FLOPS_PER_PARAM_TOKEN * num_params * seq_len / (tflops * 1e12)


def comm_bound(plan: Any, num_params: int, link: Link | None) -> dict[str, Any]:
    """What this plan's gradient traffic costs on the probed link: the time it cannot beat (a
    bound for the measured exposed communication) and the bytes; empty without a link."""
    if link is None or not num_params or plan.world_size < 2:
        return {}
    knobs = {"strategy": plan.strategy, "accumulation_steps": plan.accumulation_steps,
             "bucket_cap_mb": plan.ddp.bucket_cap_mb,
             "reshard_after_forward": plan.fsdp.reshard_after_forward}  # fmt: skip
    traffic = knob_traffic(knobs, ModelSize(num_params), plan.world_size, link,
                           precision=plan.precision)  # fmt: skip
    return {"comm_bound_s": traffic.comm_s, "comm_traffic": traffic.summary()}
