"""NCCL_ALGO and NCCL_PROTO as NCCL itself reads them, and what each value leaves enabled.

A port of ``parseList`` in NVIDIA/nccl ``src/graph/tuning.cc`` (2.24+): entries are
``;``-separated, each ``[collective:][^]name,name``; only the first may lack the
collective prefix; names and prefixes are case-insensitive; an unknown name or prefix is
``ncclInvalidUsage``. Validating with the same grammar accepts every value NCCL accepts
and refuses the ones it would refuse at the first collective of every trial. NCCL 2.21-2.23
read no prefix: they compare whole ``,``-separated tokens, so ``allreduce:ring`` names
nothing there (:func:`prefix_refusal`).

A value that parses can still leave a collective with nothing NCCL implements: NCCL has
no Tree for AllGather (DDP's constructor all-gathers, FSDP2 all-gathers parameters), so a
global ``NCCL_ALGO=Tree`` fails every multi-GPU trial. :func:`uncovered` finds those from
the static tables of ``ncclTopoTuneModel``; what the hardware lacks (NVLS without
NVSwitch, PAT with several GPUs per node) the space's conditions keep out instead.
"""

from __future__ import annotations

import re

FUNCS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")
ALGOS = ("Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT")
PROTOS = ("LL", "LL128", "Simple")
ALGO_FUNCS: dict[str, frozenset[str]] = {
    "Tree": frozenset({"AllReduce"}),
    "Ring": frozenset(FUNCS),
    "CollNetDirect": frozenset({"AllGather", "ReduceScatter", "AllReduce"}),
    "CollNetChain": frozenset({"AllReduce"}),
    "NVLS": frozenset({"AllGather", "ReduceScatter", "AllReduce"}),
    "NVLSTree": frozenset({"AllReduce"}),
    "PAT": frozenset({"AllGather", "ReduceScatter"}),
}
"""The collectives each algorithm implements (ncclTopoTuneModel skips the rest)."""
SIMPLE_ONLY = frozenset({"CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT"})
"""Algorithms NCCL runs only with the Simple protocol (their LL/LL128 bandwidth is 0)."""
AUTO = 2
"""NCCL's initial LL128 state: enabled only where NCCL validated it (hardware, topology)."""

State = dict[str, dict[str, int]]
"""Per collective, per name: 0 disabled, 1 enabled, 2 (LL128 only) NCCL decides."""


def _start(elems: tuple[str, ...]) -> State:
    return {f: {e: AUTO if e == "LL128" else 1 for e in elems} for f in FUNCS}


def _match(token: str, names: tuple[str, ...]) -> str | None:
    return next((n for n in names if n.lower() == token.lower()), None)


def parse_list(text: str, elems: tuple[str, ...]) -> State:
    """What ``text`` enables per collective, or ValueError saying why NCCL would refuse it.

    Empty pieces vanish as with C's ``strtok`` (``ring,,tree`` and ``ring;`` pass); a
    third ``:`` field is ignored as NCCL ignores it.
    """
    state = _start(elems)
    for match in re.finditer(r"[^;]+", text):
        parts = [p for p in match.group().split(":") if p]
        if not parts:
            raise ValueError(f"entry {match.group()!r} has no names (NCCL crashes on it)")
        if len(parts) == 1:
            if match.start() != 0:
                raise ValueError(
                    f"entry {match.group()!r} lacks a collective prefix; only the first may"
                )
            prefix, names = None, parts[0]
        else:
            prefix, names = parts[0], parts[1]
        funcs = FUNCS if prefix is None else (_match(prefix, FUNCS),)
        if funcs == (None,):
            raise ValueError(f"unknown collective {prefix!r}; use one of {', '.join(FUNCS)}")
        negate = names.startswith("^")
        chosen = [n for n in names.removeprefix("^").split(",") if n]
        known = [_match(n, elems) for n in chosen]
        if None in known:
            bad = chosen[known.index(None)]
            raise ValueError(f"unknown name {bad!r}; use one of {', '.join(elems)}")
        for func in funcs:
            state[func] = {e: int(negate != (e in known)) for e in elems}
    return state


PREFIX_SINCE = (2, 24)
"""The first NCCL to read ``coll:`` prefixes in NCCL_ALGO/NCCL_PROTO (``parseList``)."""


def version_tuple(version: str) -> tuple[int, ...]:
    """``"2.27.5"`` (``nccl_version()``'s form) as ``(2, 27, 5)``; digits only, a suffix dropped."""
    return tuple(int(re.match(r"\d*", part).group() or 0) for part in version.split("."))


def prefix_refusal(text: str, version: str | None) -> str | None:
    """Why NCCL ``version`` would misread ``text`` (None: it reads it, or the version is not
    known): before 2.24 a ``coll:`` prefix makes the token unknown and enables nothing."""
    if version is None or ":" not in text or version_tuple(version) >= PREFIX_SINCE:
        return None
    return (f"names a collective ('coll:name'), which NCCL reads from 2.24 on; the workers "
            f"run NCCL {version}, which would read it as an unknown name and enable nothing "
            "(the first collective then fails): upgrade torch (2.8+ ships NCCL 2.27) or give "
            "a value without a prefix")


def uncovered(algo: str | None, proto: str | None) -> list[str]:
    """Collectives that ``NCCL_ALGO``/``NCCL_PROTO`` leave no algorithm/protocol pair for."""
    algos = parse_list(algo, ALGOS) if algo else _start(ALGOS)
    protos = parse_list(proto, PROTOS) if proto else _start(PROTOS)
    return [
        f
        for f in FUNCS
        if not any(
            algos[f][a]
            and f in ALGO_FUNCS[a]
            and protos[f][p]
            and (p == "Simple" or a not in SIMPLE_ONLY)
            for a in ALGOS
            for p in PROTOS
        )
    ]


def forces_ll128(proto: str) -> list[str]:
    """Collectives for which ``proto`` turns LL128 on outright (NCCL's 1, not its 2).

    ``^LL`` does this too: an exclusion list enables every name it does not exclude.
    """
    state = parse_list(proto, PROTOS)
    return [f for f in FUNCS if state[f]["LL128"] == 1]


NVLS_FAMILY = frozenset({"NVLS", "NVLSTree"})
NVLS_REDUCTIONS: dict[str, frozenset[str]] = {
    "sum": frozenset({"int32", "int64", "fp16", "bf16", "fp32", "fp64"}),
    "max": frozenset({"int32", "int64", "fp16", "bf16"}),
    "min": frozenset({"int32", "int64", "fp16", "bf16"}),
}
"""The (operation, dtype) pairs NVLS and NVLSTree reduce: ``ncclNvlsSupported`` in NCCL's
``src/include/device.h`` (2.21+): Sum on every type, Min/Max on integers and half types only,
nothing else (Avg and Prod become other device ops). A reduction outside it finds no
algorithm when NVLS is all that NCCL_ALGO leaves for AllReduce."""


UNAVAILABLE = frozenset({"CollNetDirect", "CollNetChain"})
"""Algorithms NCCL runs only with a CollNet plugin and NCCL_COLLNET_ENABLE=1: a value that
names one beside NVLS leaves, in practice, NVLS alone."""


def nvls_only(algo: str | None, func: str) -> bool:
    """Whether ``algo`` leaves collective ``func`` nothing but NVLS/NVLSTree to run on."""
    if not algo:
        return False
    state = parse_list(algo, ALGOS)[func]
    enabled = {a for a, on in state.items() if on and func in ALGO_FUNCS[a]} - UNAVAILABLE
    return bool(enabled) and enabled <= NVLS_FAMILY


def unreducible(algo: str | None, reductions: list[tuple[str, str, str, str]]) -> list[str]:
    """Of ``reductions`` (collective, operation, dtype, who issues it) on the training
    communicator, the ones NCCL cannot run under ``algo``, each as ``who (operation dtype)``:
    NVLS has no Avg, Prod, or float Max/Min (``ncclNvlsSupported``; AllGather reduces
    nothing)."""
    runs = NVLS_REDUCTIONS.get
    return [f"{who} ({op} {dtype})" for func, op, dtype, who in reductions
            if nvls_only(algo, func) and dtype not in runs(op, frozenset())]  # fmt: skip
