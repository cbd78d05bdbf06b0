"""Which environment variables a space (or a config's fixed ``env`` section) may set.

Variables reach workers through Ray's ``worker_runtime_env``, so a name outside the
allow-list (``LD_PRELOAD``, ``PYTHONPATH``, ...) would change what every worker process
loads or runs rather than how it communicates. The allow-list keeps the tuner to
communication (and memory-allocator) settings, and the few value checks here catch the
mistakes people make when tuning NCCL by hand (``NCCL_NCHANNELS``, a name NCCL does not
read, for one).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ._env_table import KINDS, problem
from ._nccl import forces_ll128, prefix_refusal, uncovered

ENV_ALLOW_PREFIXES = (
    "NCCL_",
    "TORCH_NCCL_",
    "FI_",
    "OFI_NCCL_",
    "GLOO_",
    "UCX_",
    "RDMAV_",
    "TORCH_DISTRIBUTED_",
)
ENV_ALLOW_NAMES = frozenset(
    {"PYTORCH_CUDA_ALLOC_CONF", "CUDA_DEVICE_MAX_CONNECTIONS", "GLIBC_TUNABLES"}
)
"""Single names outside the prefixes: torch's allocator settings, the CUDA work-queue count
(Megatron-style overlap tuning) and glibc's malloc tunables (checked to ``glibc.malloc.*``
only, :data:`._env_table.MALLOC_TUNABLES`), none of which loads code or touches files."""
DOOR_WORDS = {
    "PLUGIN": "names a shared library that NCCL loads into every worker",
    "LIB": "names a shared library that is loaded into every worker",
    "SO": "names a shared library that is loaded into every worker",
    "PATH": "is a search path for executables or libraries every worker loads",
    "FILE": "names a file the worker reads or writes",
    "DIR": "names a folder the worker writes into",
    "DUMP": "makes the worker write dump files",
    "TEMPLATE": "names a file template the worker writes",
}
"""A word of a variable's name that marks it as a door (code loading or file access).

A config, a space file or ``--env`` must only change how workers communicate; these
would let one make every worker run a library or read/write a path. NCCL_CONF_FILE is
the sharpest: the file it names sets any NCCL variable, past every check here. Where
commtune needs one (its own tuner plugin, say), commtune sets it, never the config."""
DOOR_NAMES = {
    "NCCL_COMM_ID": "redirects NCCL's bootstrap to another host and port",
    "NCCL_RAS_ADDR": "opens NCCL's RAS listening socket on an address",
    "RDMAV_DRIVERS": "lists verbs provider libraries (paths allowed) for every worker to load",
}

_ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]*")
MAX_SOCKET_PRODUCT = 64
"""NCCL refuses more than 64 sockets per peer (``NCCL_SOCKET_NTHREADS * NCCL_NSOCKS_PERTHREAD``)."""
UNSAFE_FLAGS = {
    "NCCL_IB_PCI_RELAXED_ORDERING": "relaxed PCI ordering with LL128 corrupted data on HGX H100 "
    "(NCCL 2.18.1 release notes)",
    "NCCL_IGNORE_DISABLED_P2P": "uses peer-to-peer paths the driver disabled as broken",
    "OFI_NCCL_GDR_FLUSH_DISABLE": "drops the flush that makes GPUDirect writes visible to the GPU",
}
"""Flags whose value 1 NCCL (or the EFA plugin) says can corrupt data; opt-in only."""


class SpaceError(ValueError):
    """A search space, an env setting or a search context is wrong.

    ``key`` is a dotted path (``nccl.params.NCCL_BUFFSIZE.high``), a variable name or
    a file path; the message says what to change, so the CLI can print one line.
    """

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}")


def door_reason(name: str) -> str | None:
    """Why ``name`` is a door (loads code, reads or writes files), or None."""
    if name in DOOR_NAMES:
        return DOOR_NAMES[name]
    return next((DOOR_WORDS[w] for w in name.split("_") if w in DOOR_WORDS), None)


def is_env_name(name: str) -> bool:
    """True for names a space or config may set: an allowed prefix or name, and no door."""
    return (
        _ENV_NAME.fullmatch(name) is not None
        and (name.startswith(ENV_ALLOW_PREFIXES) or name in ENV_ALLOW_NAMES)
        and door_reason(name) is None
    )


def env_str(value: Any) -> str | None:
    """The string a worker sees, as NCCL reads it: YAML ``true``/``false`` become ``1``/``0``
    (NCCL reads flags with strtoll, so ``True`` would mean 0), ``null`` means unset (None)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, float, str)):
        return str(value)
    raise ValueError(f"{value!r} is not a string, number, true/false or null")


def env_strings(raw: Mapping[Any, Any], unsafe_nccl: bool = False) -> dict[str, str]:
    """A config's ``env:`` (or ``--env``) as the workers will see it, checked: every route
    in (YAML, ``--set env.X=``, ``submit --env``, the probe's ``--env``) comes through here."""
    env: dict[str, str] = {}
    for name, value in raw.items():
        if not isinstance(name, str):
            raise SpaceError(str(name), f"variable name {name!r} must be a string")
        check_env_var(name, value)
        text = env_str(value)
        if text is not None:
            env[name] = text
    check_env(env, unsafe_nccl)
    return env


def _check_name(name: str) -> None:
    if name == "NCCL_NCHANNELS":
        raise SpaceError(
            name,
            "NCCL has no NCCL_NCHANNELS variable (it would be silently ignored); force a "
            "channel count with NCCL_MIN_NCHANNELS and NCCL_MAX_NCHANNELS set to the same "
            "value (or NCCL_MIN_CTAS/NCCL_MAX_CTAS on NCCL >= 2.17)",
        )
    door = door_reason(name)
    if door is not None:
        raise SpaceError(
            name,
            f"{name} {door}; refused from configs, spaces and --env so that none can make "
            "workers load code or touch files (commtune sets such variables itself)",
        )
    if not is_env_name(name):
        raise SpaceError(
            name,
            f"{name} is not an allowed variable: only names starting with "
            f"{', '.join(ENV_ALLOW_PREFIXES)} or {', '.join(sorted(ENV_ALLOW_NAMES))} may be set "
            "(communication and memory-allocator settings only)",
        )


def check_env_var(name: str, value: Any) -> None:
    """Raise SpaceError if ``name`` may not be set, or ``value`` (None: unset) is not one
    the variable's reader accepts (:mod:`._env_table`)."""
    _check_name(name)
    try:
        text = env_str(value)
    except ValueError as e:
        raise SpaceError(name, f"{name}: {e}") from None
    if text is None:
        return
    if "\n" in text or "\0" in text:
        raise SpaceError(name, f"{name} value {value!r} contains a newline or NUL byte")
    if not (text.isascii() and text.isprintable()):
        raise SpaceError(name, f"{name}={value!r} must be printable ASCII")
    kind = KINDS.get(name)
    why = problem(kind, text) if kind is not None else None
    if why is None and name in ("NCCL_ALGO", "NCCL_PROTO"):
        why = _coverage({name: text})
    if why is not None:
        raise SpaceError(name, f"{name}={value!r} {why}")


def _coverage(env: Mapping[str, str]) -> str | None:
    """Why NCCL_ALGO/NCCL_PROTO leave some collective nothing to run (None: they do not)."""
    missing = uncovered(env.get("NCCL_ALGO"), env.get("NCCL_PROTO"))
    if not missing:
        return None
    return (
        f"leaves {', '.join(missing)} no algorithm/protocol NCCL implements (e.g. it has no "
        "Tree for AllGather, which DDP and FSDP call), so every trial would fail; force one "
        "collective instead, e.g. NCCL_ALGO=allreduce:tree"
    )


def unsafe_reason(name: str, text: str) -> str | None:
    """Why setting ``name`` to ``text`` can corrupt data by NCCL's own account, or None."""
    if name == "NCCL_PROTO":
        funcs = forces_ll128(text)
        if funcs:
            return (
                f"forces LL128 for {', '.join(funcs)}; NCCL enables LL128 only where it "
                "validated it, and forced elsewhere it can silently corrupt data "
                "(NVIDIA/nccl#831, #1261); exclude protocols instead (^LL128)"
            )
    if name in UNSAFE_FLAGS and text == "1":
        return UNSAFE_FLAGS[name]
    return None


def check_env(env: Mapping[str, Any], unsafe_nccl: bool = False) -> None:
    """Check every variable of ``env`` and the rules that span several variables.

    ``unsafe_nccl`` (the config's ``search.unsafe_nccl``) admits values NCCL says can
    corrupt data; without it they are refused, so no search can write one into best.env.
    """
    for name, value in env.items():
        check_env_var(name, value)
    text = {k: s for k, v in env.items() if (s := env_str(v)) is not None}
    if not unsafe_nccl:
        for name, value in text.items():
            why = unsafe_reason(name, value)
            if why is not None:
                raise SpaceError(
                    name, f"{name}={value!r} {why}; set search.unsafe_nccl: true to allow it"
                )
    if "NCCL_ALGO" in text and "NCCL_PROTO" in text:
        why = _coverage(text)
        if why is not None:
            raise SpaceError("NCCL_ALGO", f"NCCL_ALGO={text['NCCL_ALGO']!r} with "
                             f"NCCL_PROTO={text['NCCL_PROTO']!r} {why}")  # fmt: skip
    _check_counts(text)


def check_nccl_version(env: Mapping[str, str], version: str | None) -> None:
    """Refuse the NCCL_ALGO/NCCL_PROTO values of ``env`` that the workers' NCCL ``version``
    would misread (a ``coll:`` prefix before NCCL 2.24); None: not known, nothing refused."""
    for name in ("NCCL_ALGO", "NCCL_PROTO"):
        why = prefix_refusal(env[name], version) if env.get(name) else None
        if why is not None:
            raise SpaceError(name, f"{name}={env[name]!r} {why}")


def _check_counts(env: Mapping[str, str]) -> None:
    threads, socks = env.get("NCCL_SOCKET_NTHREADS"), env.get("NCCL_NSOCKS_PERTHREAD")
    if threads is not None and socks is not None:
        product = int(threads) * int(socks)
        if product > MAX_SOCKET_PRODUCT:
            raise SpaceError(
                "NCCL_SOCKET_NTHREADS",
                f"NCCL_SOCKET_NTHREADS * NCCL_NSOCKS_PERTHREAD = {threads} * {socks} = "
                f"{product}; NCCL allows at most {MAX_SOCKET_PRODUCT} sockets per peer",
            )
    for low_name, high_name in (("NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS"),
                                ("NCCL_MIN_CTAS", "NCCL_MAX_CTAS")):  # fmt: skip
        low, high = env.get(low_name), env.get(high_name)
        if low is not None and high is not None and int(low) > int(high):
            raise SpaceError(
                low_name,
                f"{low_name}={low} exceeds {high_name}={high}; "
                "set them equal to force a channel count",
            )
