"""Cluster addresses, checked before Ray: Ray retries an address for a minute or more (and waits
without end on one that accepts a connection but is no Ray cluster), so a typo, a closed port
or the wrong service exits 2 here in a second or two, naming the key.
"""

from __future__ import annotations

import os
import re
import socket
import time
from urllib.parse import urlsplit

from orchestrator.config.inputs import ConfigError

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
        # Ray with TLS (RAY_USE_TLS) closes a plaintext preface: only Ray's own join can tell
        tls = os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true")
        why = None if tls or url.scheme not in ("tcp", "ray") else _not_grpc(connection)
    if why:
        raise ConfigError(key, f"something answers at {address}, but not as a Ray cluster does "
                          f"({why}: another service's port?); {fix}")  # fmt: skip


HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
"""HTTP/2's client preface and an empty SETTINGS frame: a gRPC server (Ray's GCS, its client
server) answers with a SETTINGS frame of its own at once."""
GRPC_ANSWER_S = 5.0
"""How long the answer to the preface may take in all: a GCS answers in a millisecond, a
loaded head or a long tunnel in well under this; a port that says nothing is not Ray."""


def _not_grpc(connection: socket.socket) -> str | None:
    """Why the peer is not a gRPC server (None: it answered HTTP/2's preface with a SETTINGS
    frame, whose 9-byte header has the frame type 4 fourth), within one overall deadline."""
    header, deadline = b"", time.monotonic() + GRPC_ANSWER_S
    closed = "it closed the connection without an HTTP/2 answer"
    try:
        connection.sendall(HTTP2_PREFACE)
        while len(header) < 9:
            connection.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = connection.recv(9 - len(header))
            if not chunk:
                return closed
            header += chunk
    except TimeoutError:
        return f"no gRPC answer in {GRPC_ANSWER_S:g} s"
    except OSError:  # a reset: closed with our preface unread
        return closed
    return None if header[3] == 4 else "its answer is not HTTP/2"
