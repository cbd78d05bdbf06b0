"""Small collectives over the ranks (a mean loss, the slowest step time, a flag), on the device
the process group's backend serves.

NCCL takes CUDA tensors on the rank's own device only; a CPU tensor fails its first
collective. Gloo takes CPU tensors. So every small collective asks ``collective_device`` where
its tensor must live instead of taking the default device (CPU), which is right on gloo only
and therefore invisible to CPU tests (tests/dist guard this rule, see tests/dist/_placement.py).
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
from collections.abc import Callable, MutableMapping, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

OPS = {"mean": dist.ReduceOp.SUM, "sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}
SIDE_TIMEOUT_S = 900.0
"""How long a rank waits in the side group (an out-of-memory rank for its peers' verdict):
longer than a step deadline, since a peer stuck in a collective is ended by its watchdog,
which gloo reports."""
_SIDE_GROUP: list[tuple[Any, dist.ProcessGroup]] = []
"""The (process group, its side group) pair made last: a new process group (an elastic
restart) gets its own side group."""


def side_group() -> dist.ProcessGroup | None:
    """A gloo group over all ranks, for commtune's own figures and agreements, made once per
    process group; None on one rank.

    Off the training communicator for two reasons. NCCL matches collectives by order: a flag
    all-reduced there by a rank that ran out of memory pairs with whatever a peer waits in (a
    bucket all-reduce, an FSDP all-gather). And a forced NCCL_ALGO limits which reductions run:
    NVLS has no float64 Max, so the slowest step time, the guard's norms or the probe's timings
    reduced over NCCL would fail every NVLS trial. Every rank must reach the first call at the
    same point (``new_group`` is collective): the callers are all collective points already.
    """
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return None
    world = dist.group.WORLD
    if not _SIDE_GROUP or _SIDE_GROUP[0][0] is not world:
        route_gloo(os.environ, [name for _, name in socket.if_nameindex()], has_ipv4)
        timeout = timedelta(seconds=SIDE_TIMEOUT_S)
        _SIDE_GROUP[:] = [(world, dist.new_group(backend="gloo", timeout=timeout))]
    return _SIDE_GROUP[0][1]


def collective_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """The device whose tensors ``group``'s backend takes: this rank's current CUDA device
    under NCCL, the CPU otherwise (gloo; also when no process group is initialised)."""
    if dist.is_initialized() and dist.get_backend(group) == dist.Backend.NCCL:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def matching_interfaces(spec: str, names: list[str]) -> list[str]:
    """The interfaces of ``names`` that NCCL_SOCKET_IFNAME's ``spec`` selects, by NCCL's
    grammar: a comma list of name prefixes, ``=`` before it for exact names, ``^`` to
    exclude instead of select."""
    exclude, spec = spec.startswith("^"), spec.removeprefix("^")
    exact, spec = spec.startswith("="), spec.removeprefix("=")
    wanted = [w for w in spec.split(",") if w]
    hit = [n for n in names if any(n == w if exact else n.startswith(w) for w in wanted)]
    return [n for n in names if n not in hit] if exclude else hit


def route_gloo(
    environ: MutableMapping[str, str], names: list[str], usable: Callable[[str], bool]
) -> str | None:
    """Point gloo at the interface NCCL was told to use: the side group's gloo otherwise picks
    its own (the hostname's), which on EFA or InfiniBand nodes may not route between them.
    Sets GLOO_SOCKET_IFNAME (unless already set) to the first matching interface that is
    ``usable`` (up, with an IPv4 address): one, as NCCL's bootstrap takes one; gloo makes a
    device per name listed, and one without an address fails the whole group. Says in one
    line when none matches (gloo then picks its own)."""
    spec = environ.get("NCCL_SOCKET_IFNAME")
    if not spec or environ.get("GLOO_SOCKET_IFNAME"):
        return environ.get("GLOO_SOCKET_IFNAME")
    chosen = next((n for n in matching_interfaces(spec, names) if usable(n)), None)
    if chosen is None:
        print(f"commtune: NCCL_SOCKET_IFNAME={spec} matches no usable interface of this node "
              f"({', '.join(names)}); gloo picks its own for commtune's side group, which may "
              "not route between nodes: set GLOO_SOCKET_IFNAME", flush=True)  # fmt: skip
        return None
    environ["GLOO_SOCKET_IFNAME"] = chosen
    return chosen


def has_ipv4(name: str) -> bool:
    """Whether interface ``name`` is up with an IPv4 address (Linux's SIOCGIFADDR)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
        return True
    except OSError:
        return False


def reduce_over_ranks(values: Sequence[float], op: str = "mean") -> list[float]:
    """Element-wise ``op`` (mean, sum or max) of ``values`` across all ranks, in float64, over
    the side group; every rank must call it at the same point. On one rank the values come
    back as they are."""
    return reduce_tensor(torch.tensor(values, dtype=torch.float64), op).tolist()


def reduce_tensor(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """``tensor`` (any device) reduced element-wise across all ranks over the side group,
    returned on the side group's device (the CPU); every rank must call it alike."""
    group = side_group()
    if group is None:
        return tensor
    tensor = tensor.to(collective_device(group))  # a copy where it lived on a GPU
    dist.all_reduce(tensor, op=OPS[op], group=group)
    if op == "mean":
        tensor /= dist.get_world_size(group)
    return tensor


def gpu_uuid(device: torch.device) -> str:
    """The UUID of the GPU ``device`` as nvidia-smi prints it (``GPU-...``), "" off a GPU:
    a group on the same nodes may hold other GPUs of them, so a measurement records its own."""
    if device.type != "cuda":
        return ""
    return f"GPU-{torch.cuda.get_device_properties(device).uuid}"


def nccl_version() -> str | None:
    """The NCCL version torch ships (``2.27.5``), None without CUDA: NCCL's accepted values
    and defaults change between versions, so a run records the one it tuned."""
    if not torch.cuda.is_available():
        return None
    version = torch.cuda.nccl.version()
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
