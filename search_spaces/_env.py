"""Which environment variables a space (or a config's fixed ``env`` section) may set.

Variables reach workers through Ray's ``worker_runtime_env``, so a name outside the
allow-list (``LD_PRELOAD``, ``PYTHONPATH``, ...) would change what every worker process
loads or runs rather than how it communicates. The allow-list keeps the tuner to
communication settings, and the few value checks here catch the mistakes people make
when tuning NCCL by hand (see the motivating write-up's ``NCCL_NCHANNELS``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

ENV_ALLOW_PREFIXES = (
    "NCCL_",
    "TORCH_NCCL_",
    "FI_",
    "GLOO_",
    "UCX_",
    "RDMAV_",
    "TORCH_DISTRIBUTED_",
)

PLAN_KNOBS = frozenset(
    {
        "strategy",
        "accumulation_steps",
        "bucket_cap_mb",
        "gradient_as_bucket_view",
        "static_graph",
        "reshard_after_forward",
        "activation_checkpointing",
    }
)
"""Params that become ``TrialPlan`` fields rather than environment variables."""

_ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]*")
NCCL_NTHREADS_VALUES = (64, 128, 256, 512)
MAX_SOCKET_PRODUCT = 64
"""NCCL refuses more than 64 sockets per peer (``NCCL_SOCKET_NTHREADS * NCCL_NSOCKS_PERTHREAD``)."""

_POSITIVE_INT_VARS = (
    "NCCL_BUFFSIZE",
    "NCCL_SOCKET_NTHREADS",
    "NCCL_NSOCKS_PERTHREAD",
    "NCCL_MIN_NCHANNELS",
    "NCCL_MAX_NCHANNELS",
    "NCCL_MIN_CTAS",
    "NCCL_MAX_CTAS",
)


class SpaceError(ValueError):
    """A search space, an env setting or a search context is wrong.

    ``key`` is a dotted path (``nccl.params.NCCL_BUFFSIZE.high``), a variable name or
    a file path; the message says what to change, so the CLI can print one line.
    """

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}")


def is_env_name(name: str) -> bool:
    """True for names a space may set as environment variables (allow-listed prefixes)."""
    return name.startswith(ENV_ALLOW_PREFIXES) and _ENV_NAME.fullmatch(name) is not None


def env_str(value: Any) -> str:
    """The string a worker sees: booleans as ``1``/``0`` (NCCL's convention), else ``str``."""
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _as_positive_int(name: str, value: Any) -> int:
    text = env_str(value).strip()
    if isinstance(value, bool) or not text.isdigit() or int(text) < 1:
        raise SpaceError(name, f"{name}={value!r} must be a positive integer")
    return int(text)


def check_env_var(name: str, value: Any) -> None:
    """Raise SpaceError if ``name`` may not be set, or ``value`` (None: unset) is wrong for it."""
    if name == "NCCL_NCHANNELS":
        raise SpaceError(
            name,
            "NCCL has no NCCL_NCHANNELS variable (it would be silently ignored); force a "
            "channel count with NCCL_MIN_NCHANNELS and NCCL_MAX_NCHANNELS set to the same "
            "value (or NCCL_MIN_CTAS/NCCL_MAX_CTAS on NCCL >= 2.17)",
        )
    if not is_env_name(name):
        raise SpaceError(
            name,
            f"{name} is not an allowed variable: only names starting with "
            f"{', '.join(ENV_ALLOW_PREFIXES)} may be set (communication settings only)",
        )
    if value is None:
        return
    text = env_str(value)
    if "\n" in text or "\0" in text:
        raise SpaceError(name, f"{name} value {value!r} contains a newline or NUL byte")
    if name == "NCCL_BUFFSIZE":
        try:
            _as_positive_int(name, value)
        except SpaceError:
            raise SpaceError(
                name,
                f"NCCL_BUFFSIZE={value!r} must be a positive integer number of bytes "
                "(e.g. 4194304 for 4 MiB, NCCL's default)",
            ) from None
    elif name == "NCCL_NTHREADS":
        if text.strip() not in {str(n) for n in NCCL_NTHREADS_VALUES}:
            raise SpaceError(
                name,
                f"NCCL_NTHREADS={value!r}: NCCL accepts only "
                f"{', '.join(map(str, NCCL_NTHREADS_VALUES))} threads per block",
            )
    elif name in _POSITIVE_INT_VARS:
        _as_positive_int(name, value)


def check_env(env: Mapping[str, Any]) -> None:
    """Check every variable of ``env`` and the rules that span several variables."""
    for name, value in env.items():
        check_env_var(name, value)
    threads = env.get("NCCL_SOCKET_NTHREADS")
    socks = env.get("NCCL_NSOCKS_PERTHREAD")
    if threads is not None and socks is not None:
        product = int(env_str(threads)) * int(env_str(socks))
        if product > MAX_SOCKET_PRODUCT:
            raise SpaceError(
                "NCCL_SOCKET_NTHREADS",
                f"NCCL_SOCKET_NTHREADS * NCCL_NSOCKS_PERTHREAD = {threads} * {socks} = "
                f"{product}; NCCL allows at most {MAX_SOCKET_PRODUCT} sockets per peer",
            )
    low, high = env.get("NCCL_MIN_NCHANNELS"), env.get("NCCL_MAX_NCHANNELS")
    if low is not None and high is not None and int(env_str(low)) > int(env_str(high)):
        raise SpaceError(
            "NCCL_MIN_NCHANNELS",
            f"NCCL_MIN_NCHANNELS={low} exceeds NCCL_MAX_NCHANNELS={high}; "
            "set them equal to force a channel count",
        )


def knob_defaults() -> dict[str, Any]:
    """Each plan knob's value when no loaded space samples it (TrialPlan's defaults).

    A condition may test a knob whose space is not loaded (``static_graph`` tests
    ``accumulation_steps``); it then sees the value every trial will really use.
    """
    from train_fns.plan import DDPOptions, FSDPOptions, TrialPlan

    fields = TrialPlan.__dataclass_fields__
    return {
        "accumulation_steps": 1,
        "activation_checkpointing": fields["activation_checkpointing"].default,
        **dataclasses.asdict(DDPOptions()),
        **dataclasses.asdict(FSDPOptions()),
    }
