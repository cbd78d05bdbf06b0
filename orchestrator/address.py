"""Cluster addresses, checked before Ray: Ray retries an address for a minute or more (and waits
without end on one that accepts a connection but is no Ray cluster), so a typo, a closed port
or the wrong service exits 2 here in a second or two, naming the key.
"""

from __future__ import annotations

import re
import socket
from urllib.parse import urlsplit

from orchestrator.inputs import ConfigError

ADDRESS = re.compile(r"(ray://)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):\d{1,5}|auto|local")


def check_address(address: str | None, key: str = "cluster.address") -> None:
    """``auto``, ``HOST:PORT`` or ``ray://HOST:PORT`` (a typo made Ray retry for minutes)."""
    if address is None:
        return
    port = address.rpartition(":")[2]
    if not ADDRESS.fullmatch(address) or (port.isdigit() and not 0 < int(port) < 65536):
        raise ConfigError(key, f"got {address!r}; use auto, HOST:PORT or ray://HOST:PORT")


REACH_TIMEOUT_S = 1.5
"""How long a TCP connect to a cluster may take: a head answers in milliseconds, even across
regions (and a lost SYN is resent after 1 s); an address nothing answers at made Ray retry
for a minute or more before it failed."""


def check_reachable(address: str | None, key: str, fix: str) -> None:
    """Something listens at ``address`` (``HOST:PORT``, ``ray://HOST:PORT`` or an http(s)
    URL): a TCP connect, closed at once. ``auto`` and what does not parse are left to Ray."""
    if address is None or address in ("auto", "local"):
        return
    try:
        url = urlsplit(address if "://" in address else f"tcp://{address}")
        host, port = url.hostname, url.port or {"http": 80, "https": 443}.get(url.scheme)
    except ValueError:  # a port out of range: check_address names it
        return
    if not host or not port:
        return
    try:
        connection = socket.create_connection((host, port), timeout=REACH_TIMEOUT_S)
    except OSError as e:
        why = f"no answer in {REACH_TIMEOUT_S:g} s" if isinstance(e, TimeoutError) else e.strerror
        raise ConfigError(key, f"nothing answers at {address} ({why or e}); {fix}") from e
    with connection:
        if url.scheme in ("tcp", "ray") and not _speaks_grpc(connection):
            raise ConfigError(
                key, f"something answers at {address}, but not as a Ray cluster does (no gRPC "
                f"answer in {REACH_TIMEOUT_S:g} s: another service's port?); {fix}"
            )  # fmt: skip


HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
"""HTTP/2's client preface and an empty SETTINGS frame: a gRPC server (Ray's GCS, its client
server) answers with a SETTINGS frame of its own at once."""


def _speaks_grpc(connection: socket.socket) -> bool:
    """The peer answers HTTP/2's preface with a SETTINGS frame (its frame header: 9 bytes,
    the fourth the frame type 4), within the reach timeout."""
    header = b""
    try:
        connection.sendall(HTTP2_PREFACE)
        while len(header) < 9:
            chunk = connection.recv(9 - len(header))
            if not chunk:
                break
            header += chunk
    except OSError:  # a timeout or a reset: no gRPC server there
        return False
    return len(header) == 9 and header[3] == 4
