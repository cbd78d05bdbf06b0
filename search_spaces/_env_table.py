"""What each known variable accepts, checked before a worker ever reads it.

NCCL reads its numeric variables with ``strtoll`` and ignores what follows the digits,
so ``NCCL_IB_DISABLE=True`` is read as 0 (the opposite of what the YAML said) and a
non-ASCII digit is read as nothing at all. Every value a config, a space or ``--env``
gives is therefore checked against the kind NCCL (or torch) reads: ``int`` (ASCII digits
in a range), ``flag`` (an int with a few meanings), ``enum`` (case-insensitive names),
``level`` (a topology distance by name or number), ``algo``/``proto`` (NCCL's list
grammar, :mod:`._nccl`), ``alloc`` (torch's allocator settings) and ``tunables`` (glibc's
malloc tunables). Variables not in the table get only the generic checks of
:func:`._env.check_env_var`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ._nccl import ALGOS, PROTOS, parse_list

LEVELS = ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")
"""NCCL's path types for NCCL_P2P_LEVEL / NCCL_NET_GDR_LEVEL (PATH_LOC .. PATH_SYS;
numbers 0-5 are the legacy spelling)."""
ALLOC_KEYS = (
    "expandable_segments", "max_split_size_mb", "garbage_collection_threshold",
    "roundup_power2_divisions", "backend", "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register", "pinned_num_register_threads",
)  # fmt: skip
"""Keys torch's CUDA caching allocator reads from PYTORCH_CUDA_ALLOC_CONF."""
MALLOC_TUNABLES = (
    "arena_max", "arena_test", "mmap_max", "mmap_threshold", "top_pad", "trim_threshold",
    "tcache_count", "tcache_max", "tcache_unsorted_limit", "mxfast",
)  # fmt: skip
"""glibc's numeric malloc tunables (``glibc.malloc.NAME`` in GLIBC_TUNABLES, glibc >= 2.26).
Only these: other tunables pick CPU code paths (``glibc.cpu.*``) or change how the dynamic
loader works (``glibc.rtld.*``), which is not a memory setting."""


@dataclass(frozen=True)
class Kind:
    """How one variable's value is read; ``low``/``high`` bound ints, ``choices`` enums."""

    kind: str
    low: int = 0
    high: int = 0
    choices: tuple[str, ...] = ()
    hint: str = ""


def _int(low: int, high: int, hint: str = "") -> Kind:
    return Kind("int", low, high, hint=hint)


def _flag(high: int = 1, hint: str = "") -> Kind:
    return Kind("flag", 0, high, hint=hint or "1 or 0 (YAML true/false become 1/0)")


def _enum(*choices: str) -> Kind:
    return Kind("enum", choices=choices)


CHANNELS = _int(1, 64, "channels: 1..64 (MAXCHANNELS)")
KINDS: dict[str, Kind] = {
    "NCCL_BUFFSIZE": _int(1, 1 << 34, "bytes, e.g. 4194304 for 4 MiB, NCCL's default"),
    "NCCL_NTHREADS": _enum("64", "128", "256", "512"),
    "NCCL_MIN_NCHANNELS": CHANNELS,
    "NCCL_MAX_NCHANNELS": CHANNELS,
    "NCCL_MIN_CTAS": CHANNELS,
    "NCCL_MAX_CTAS": CHANNELS,
    "NCCL_SOCKET_NTHREADS": _int(1, 16, "NCCL allows 1..16 socket threads"),
    "NCCL_NSOCKS_PERTHREAD": _int(1, 64, "sockets per thread, at most 64 per peer in all"),
    "NCCL_ALGO": Kind("algo"),
    "NCCL_PROTO": Kind("proto"),
    "NCCL_P2P_LEVEL": Kind("level"),
    "NCCL_NET_GDR_LEVEL": Kind("level"),
    "NCCL_IB_QPS_PER_CONNECTION": _int(1, 128, "queue pairs per connection: 1..128"),
    "NCCL_IB_TIMEOUT": _int(1, 31, "InfiniBand timeout exponent: 1..31"),
    "NCCL_IB_RETRY_CNT": _int(0, 7, "InfiniBand retry count: 0..7"),
    "NCCL_NVLS_ENABLE": _flag(2, "0 (off), 1 (on) or 2 (NCCL decides, the default)"),
    "NCCL_CROSS_NIC": _flag(2, "0 (same NIC), 1 (may cross) or 2 (NCCL decides)"),
    "NCCL_IB_PCI_RELAXED_ORDERING": _flag(2, "0 (off), 1 (on) or 2 (where available)"),
    "NCCL_DEBUG": _enum("VERSION", "WARN", "INFO", "TRACE", "ABORT"),
    "NCCL_LAUNCH_MODE": _enum("PARALLEL", "GROUP"),
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": _flag(3, "0..3 (torch's error-handling modes)"),
    "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": _int(1, 86400),
    "CUDA_DEVICE_MAX_CONNECTIONS": _int(1, 32, "hardware work queues: 1..32"),
    "OFI_NCCL_PROTOCOL": _enum("SENDRECV", "RDMA"),
    "PYTORCH_CUDA_ALLOC_CONF": Kind("alloc"),
    "GLIBC_TUNABLES": Kind("tunables"),
    "NCCL_SOCKET_IFNAME": Kind("ifnames", hint="nccl"),
    "GLOO_SOCKET_IFNAME": Kind("ifnames", hint="gloo"),
}
for _name in (
    "NCCL_IB_DISABLE", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_NET_GDR_READ",
    "NCCL_PXN_DISABLE", "NCCL_NVB_DISABLE", "NCCL_CUMEM_ENABLE", "NCCL_COLLNET_ENABLE",
    "NCCL_IGNORE_DISABLED_P2P", "NCCL_DMABUF_ENABLE", "NCCL_IB_ADAPTIVE_ROUTING",
    "NCCL_P2P_DIRECT_DISABLE", "NCCL_CHECKS_DISABLE", "NCCL_GRAPH_REGISTER",
    "TORCH_NCCL_AVOID_RECORD_STREAMS", "TORCH_NCCL_BLOCKING_WAIT",
    "TORCH_NCCL_ENABLE_MONITORING", "TORCH_NCCL_HIGH_PRIORITY", "TORCH_NCCL_USE_COMM_NONBLOCKING",
    "OFI_NCCL_GDR_FLUSH_DISABLE", "OFI_NCCL_USE_IPV6_TCP", "OFI_NCCL_MR_CACHE_DISABLE",
    "OFI_NCCL_DISABLE_DMABUF", "OFI_NCCL_DISABLE_NATIVE_RDMA_CHECK", "OFI_NCCL_CUDA_FLUSH_ENABLE",
):  # fmt: skip
    KINDS[_name] = _flag()


def _check_alloc(text: str) -> str | None:
    for item in text.split(","):
        key, sep, value = item.partition(":")
        if key.strip() not in ALLOC_KEYS or not sep:
            return f"each item is KEY:VALUE with KEY one of {', '.join(ALLOC_KEYS)}"
        if not re.fullmatch(r"[A-Za-z0-9_.]+", value.strip()):
            return f"{key}'s value {value!r} must be a plain word or number"
    return None


def _check_tunables(text: str) -> str | None:
    for item in text.split(":"):
        name, sep, value = item.partition("=")
        short = name.removeprefix("glibc.malloc.")
        if short == name or short not in MALLOC_TUNABLES or not sep:
            return (f"each item is glibc.malloc.NAME=VALUE (items joined by ':') with NAME one of "
                    f"{', '.join(MALLOC_TUNABLES)}; {item!r} is not")  # fmt: skip
        if not re.fullmatch(r"[0-9]{1,20}", value):
            return f"{name}'s value {value!r} must be ASCII digits (bytes or a count)"
    return None


IFNAME = re.compile(r"[A-Za-z0-9_.:@-]{1,15}")
"""An interface name as Linux allows it (IFNAMSIZ: 15 characters)."""


def _check_ifnames(text: str, grammar: str) -> str | None:
    """NCCL: ``[^][=]name,name`` (prefixes, ``=`` exact, ``^`` exclude); gloo: exact names
    only, each making a device of its own (an empty or unknown one fails the process group)."""
    names = text
    if grammar == "nccl":
        names = names.removeprefix("^").removeprefix("=")
    parts = names.split(",")
    if not all(IFNAME.fullmatch(p) for p in parts):
        shape = ("[^][=]name,name: interface names of 1-15 characters, no empty entry"
                 if grammar == "nccl" else "name,name: exact interface names of 1-15 "
                 "characters, no ^ or =, no empty entry")  # fmt: skip
        return f"must be {shape} (e.g. eth0)"
    return None


def _check_level(text: str) -> str | None:
    if text.upper() in LEVELS or text in {str(i) for i in range(len(LEVELS))}:
        return None
    return f"use one of {', '.join(LEVELS)} (or 0..5)"


def problem(kind: Kind, text: str) -> str | None:
    """Why ``text`` is not a value of ``kind`` (None: it is); the caller names the variable."""
    if kind.kind in ("int", "flag"):
        if not re.fullmatch(r"[0-9]+", text):
            return f"must be ASCII digits: {kind.hint or f'{kind.low}..{kind.high}'}"
        if not kind.low <= int(text) <= kind.high:
            return f"is out of range: {kind.hint or f'{kind.low}..{kind.high}'}"
        return None
    if kind.kind == "enum":
        ok = text.upper() in {c.upper() for c in kind.choices}
        return None if ok else f"use one of {', '.join(kind.choices)}"
    if kind.kind in ("algo", "proto"):
        algo = kind.kind == "algo"
        try:
            parse_list(text, ALGOS if algo else PROTOS)
        except ValueError as e:
            example = "allreduce:tree or ^tree" if algo else "^LL128 or allreduce:Simple"
            return f"{e}; NCCL would refuse it (e.g. {example})"
        return None
    if kind.kind == "level":
        return _check_level(text)
    if kind.kind == "ifnames":
        return _check_ifnames(text, kind.hint)
    if kind.kind == "tunables":
        return _check_tunables(text)
    return _check_alloc(text)
