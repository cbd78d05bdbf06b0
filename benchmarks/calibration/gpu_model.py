"""The simulated "true" throughput of BERT-large on the motivating GPU clusters.

An assumption, not a measurement: it exists so the search strategies can be compared on
landscapes shaped like the real problem (memory limits, compute-bound vs link-bound regimes,
NCCL knobs that help or hurt) until such grids are recorded. It deliberately differs from
what the seeding cost model knows (``orchestrator.planning.costmodel`` with nominal ``LINKS``
figures,
compute independent of micro-batch, no memory, no NCCL variables), so seeding is not
circular:

- the true link is slower than its nominal figure (``bandwidth_factor``, ``latency_factor``);
- a micro-step has a fixed overhead worth ``MICRO_OVERHEAD_SAMPLES`` samples of compute
  (kernel launches, optimizer-free per-step work), so accumulation costs throughput;
- activation checkpointing recomputes the forward (+1/3 compute);
- memory per rank (Adam states, DDP's bucket copy, FSDP's gathered units, activations after
  Korthikanti et al. 2022: ``s*h*(34 + 5*a*s/h)`` bytes per layer per sample) decides OOM;
- NCCL (a simplified model of its effect, not of its tuner): the default is Ring/Simple with
  ``default_channels`` channels; achieved bandwidth grows with channels up to
  ``saturating_channels``, each channel takes one SM from the overlapped compute; LL halves
  bandwidth for a fifth of the latency, LL128 keeps ``ll128_bandwidth`` of it for half the
  latency; Tree applies to DDP's all-reduce only (NCCL has no tree all-gather);
- ``gradient_as_bucket_view`` saves a copy of the gradients (time and memory),
  ``static_graph`` 1% of DDP's per-step bookkeeping.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.planning.costmodel import LINKS, Link, ModelSize, predict_throughput

SEQ_LEN = 512
GLOBAL_BATCH = 64
HIDDEN, HEADS = 1024, 16  # BERT-large
MICRO_OVERHEAD_SAMPLES = 0.5
WORKSPACE_BYTES = 1.5e9  # CUDA context, cuBLAS/NCCL workspaces, fragmentation
HBM_COPY_BYTES_PER_S = 500e9
PROTOCOLS = {None: (1.0, 1.0), "Simple": (1.0, 1.0), "LL": (0.5, 0.2)}
"""protocol: (bandwidth share, latency share); LL128's bandwidth share is per cluster."""


@dataclass(frozen=True)
class Cluster:
    """One motivating cluster; compute figures are typical achieved rates, not peaks."""

    name: str
    nominal_link: Link
    """What the seeding cost model is told (costmodel.LINKS)."""
    world_size: int
    num_nodes: int
    tflops: float
    """Achieved per rank: V100 fp16 45 (36% of 125 peak), A100 bf16 130 (42% of 312), the
    range MLPerf-class BERT runs report."""
    memory_bytes: float
    num_sms: int
    default_channels: int
    saturating_channels: int
    ll128_bandwidth: float
    bandwidth_factor: float = 0.8
    latency_factor: float = 2.0

    def compute_s_per_sample(self, model: ModelSize) -> float:
        """6 x params x tokens FLOPs per sample (forward + backward), as the dry run counts."""
        return 6 * model.num_params * SEQ_LEN / self.tflops


CLUSTERS = (
    Cluster("4xV100-pcie", LINKS["pcie_v100"], 4, 1, 45e12, 16e9, 80, 2, 2, 0.6),
    Cluster("8xA100-nvlink", LINKS["nvlink_a100"], 8, 1, 130e12, 40e9, 108, 16, 16, 0.95),
    Cluster("2x4xV100-100g", LINKS["net_100g"], 8, 2, 45e12, 16e9, 80, 2, 4, 0.6),
    Cluster("2x8xA100-100g", LINKS["net_100g"], 16, 2, 130e12, 40e9, 108, 2, 4, 0.6),
)
"""Channels: NCCL's own count saturates PCIe and NVSwitch (forcing more only costs SMs);
between nodes over TCP sockets it leaves bandwidth unused, which more channels recover
(the gain AutoCCL reports for inter-node traffic)."""


def activation_bytes(model: ModelSize, micro_batch: int, checkpointing: bool) -> float:
    """Saved activations of a micro-batch in 16-bit (Korthikanti et al. 2022, no recompute)."""
    per_layer = SEQ_LEN * HIDDEN * (34 + 5 * HEADS * SEQ_LEN / HIDDEN)
    if checkpointing:  # only block inputs are kept, one block is live during recompute
        return micro_batch * (model.num_layers * 2 * SEQ_LEN * HIDDEN + per_layer)
    return micro_batch * model.num_layers * per_layer


def memory_bytes(cluster: Cluster, model: ModelSize, p: dict[str, Any]) -> float:
    """Peak bytes per rank: fp32 weights, grads and Adam moments (16 B/param) plus the rest."""
    n, params = cluster.world_size, model.num_params
    micro = GLOBAL_BATCH // n // p.get("accumulation_steps", 1)
    act = activation_bytes(model, micro, bool(p.get("activation_checkpointing")))
    if p.get("strategy", "ddp") == "ddp":
        copy = 0.0 if p.get("gradient_as_bucket_view") else 4 * params
        return 16 * params + copy + act + WORKSPACE_BYTES
    unit = 4 * params / model.num_fsdp_units
    kept = 0.0 if p.get("reshard_after_forward", True) else 4 * params * (n - 1) / n
    return 16 * params / n + 2 * unit + kept + act + WORKSPACE_BYTES


def _channels(cluster: Cluster, p: dict[str, Any]) -> int:
    return p.get("NCCL_MIN_NCHANNELS") or cluster.default_channels


def true_link(cluster: Cluster, p: dict[str, Any]) -> Link:
    """The link as the trial's NCCL settings let it perform."""
    bandwidth, latency = PROTOCOLS.get(p.get("NCCL_PROTO"), (cluster.ll128_bandwidth, 0.5))
    width = min(1.0, _channels(cluster, p) / cluster.saturating_channels)
    nominal = cluster.nominal_link
    return Link(
        nominal.bandwidth_bytes_per_s * cluster.bandwidth_factor * width * bandwidth,
        nominal.latency_s * cluster.latency_factor * latency,
        f"{nominal.name} (true)",
    )


def throughput(cluster: Cluster, model: ModelSize, p: dict[str, Any]) -> float | None:
    """True global samples/s of one configuration; None when it runs out of memory."""
    if memory_bytes(cluster, model, p) > 0.95 * cluster.memory_bytes:
        return None
    per_worker = GLOBAL_BATCH // cluster.world_size
    accumulation = p.get("accumulation_steps", 1)
    compute_s = cluster.compute_s_per_sample(model) * (
        per_worker + accumulation * MICRO_OVERHEAD_SAMPLES
    )
    compute_s *= 4 / 3 if p.get("activation_checkpointing") else 1.0
    compute_s *= 1 + _channels(cluster, p) / cluster.num_sms
    if p.get("strategy", "ddp") == "ddp" and not p.get("gradient_as_bucket_view"):
        compute_s += 4 * model.num_params / HBM_COPY_BYTES_PER_S
    algorithm = "tree" if p.get("NCCL_ALGO") == "allreduce:tree" else "ring"
    value = predict_throughput(
        p, model, cluster.world_size, true_link(cluster, p), compute_s / per_worker,
        global_batch=GLOBAL_BATCH, algorithm=algorithm,
    )  # fmt: skip
    return value * (1.01 if p.get("static_graph") else 1.0)
