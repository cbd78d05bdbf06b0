"""A cluster address nothing answers at exits 2 before Ray (Ray itself would retry
``--address 127.0.0.1:1`` for 40 s, then raise a traceback); the submit path checks its Jobs
API."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.cluster.session import check_ray_address, start_ray
from orchestrator.config.address import GRPC_ANSWER_S, check_reachable
from orchestrator.config.schema import Config, ConfigError
from orchestrator.submit import cli as submit

ROOT = Path(__file__).resolve().parents[2]
RAY_RETRY_S = 40.0
"""How long Ray retried an address nothing answers at before it failed (with a traceback)."""


@pytest.fixture
def listening() -> Iterator[int]:
    """A port something listens at (a GCS stand-in), and one that nothing does."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


def _serve(answer: bytes | None) -> socket.socket:
    """A loopback server that reads what a client sends and answers ``answer``, or closes at
    once (None); close the returned socket to end it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def serve() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:  # closed: the test is over
                return
            with connection:
                if answer is not None:
                    connection.recv(64)
                    connection.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    return server


@pytest.fixture
def grpc_like() -> Iterator[int]:
    """A port that answers HTTP/2's preface with a SETTINGS frame, as a gRPC server (Ray's GCS,
    its client server) does at once."""
    server = _serve(bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
    yield server.getsockname()[1]
    server.close()


def _search_at(address: str, out: Path) -> subprocess.CompletedProcess:
    """The real search CLI (the smoke preset) pointed at ``address``."""
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.search", "--preset", "smoke", "--address", address,
         "--out", str(out)],  # fmt: skip
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_answering_address_passes_and_auto_is_left_to_ray(
    grpc_like: int, listening: int
) -> None:
    for address in (f"127.0.0.1:{grpc_like}", f"ray://127.0.0.1:{grpc_like}", "auto", None):
        check_reachable(address, "--address", "fix")
    check_reachable(f"http://127.0.0.1:{listening}", "--address", "fix")  # no gRPC asked of it


def test_a_port_that_answers_but_not_as_ray_is_refused(listening: int) -> None:
    """Ray waited without end on a port that accepts a connection and says nothing."""
    with pytest.raises(ConfigError, match="something answers at 127.0.0.1:.* not as a Ray"):
        check_reachable(f"127.0.0.1:{listening}", "--address", "fix")


def test_a_closed_port_an_unknown_host_and_silence_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = _closed_port()
    with pytest.raises(ConfigError, match=rf"--address: nothing answers at 127.0.0.1:{port} \("):
        check_reachable(f"127.0.0.1:{port}", "--address", "start it")
    with pytest.raises(ConfigError, match="nothing answers at no-such-host.invalid:6379"):
        check_reachable("no-such-host.invalid:6379", "--address", "start it")

    def silent(*args: object, **kwargs: object) -> None:
        raise TimeoutError("timed out")

    monkeypatch.setattr(socket, "create_connection", silent)
    with pytest.raises(ConfigError, match=r"no answer in 1.5 s\); start it"):
        check_reachable("10.255.255.1:6379", "--address", "start it")


def test_ray_address_names_where_it_came_from(monkeypatch: pytest.MonkeyPatch) -> None:
    port = _closed_port()
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    with pytest.raises(ConfigError, match="RAY_ADDRESS: nothing answers.*ray start --head"):
        check_ray_address(Config())


def test_an_answer_that_is_not_ray_through_the_cli_is_one_line_fast(
    listening: int, tmp_path: Path
) -> None:
    """A real search pointed at a port that accepts and says nothing (it waited over 300 s in
    ray.init before): exit 2, one line naming --address, no Ray started, nothing written. The
    only wait is the check's own bounded one, as its line says (a wait without end would
    overrun the run's timeout)."""
    proc = _search_at(f"127.0.0.1:{listening}", tmp_path / "out")
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1, proc.stderr
    assert "--address: something answers at" in err[0] and "not as a Ray cluster" in err[0]
    assert f"no gRPC answer in {GRPC_ANSWER_S:g} s" in err[0], err[0]
    assert not (tmp_path / "out").exists() and "Started a local Ray" not in proc.stdout


def test_a_join_that_ray_refuses_is_one_config_error(
    grpc_like: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gRPC service that is not Ray: Ray's retries end in ConnectionError, said in one line
    (the stand-in answers as gRPC does; ray.init stands in for Ray's join)."""
    import ray

    def refuse(**kwargs: object) -> None:
        raise ConnectionError(f"Failed to connect to Ray cluster at 127.0.0.1:{grpc_like}")

    monkeypatch.setattr(ray, "init", refuse)
    config = Config()
    config.cluster.address = f"127.0.0.1:{grpc_like}"
    with pytest.raises(ConfigError, match="cluster.address: cannot join a Ray cluster at"):
        start_ray(config, verbose=False)


def test_submit_checks_the_jobs_api_address_first(capsys: pytest.CaptureFixture) -> None:
    port = _closed_port()
    code = submit.main(["--address", f"http://127.0.0.1:{port}", "status", "job-1"])
    err = capsys.readouterr().err.splitlines()[-1]
    assert code == 2 and f"--address: nothing answers at http://127.0.0.1:{port}" in err


def test_an_unreachable_address_exits_fast_through_the_cli(tmp_path: Path) -> None:
    """Through the real CLI: exit 2 naming --address, no Ray started, nothing written, and
    fast: the whole run (about half a second on the 2-core machine) well inside the 40 s Ray
    spent retrying such an address, with room for a loaded machine."""
    started = time.monotonic()
    proc = _search_at(f"127.0.0.1:{_closed_port()}", tmp_path / "out")
    elapsed = time.monotonic() - started
    assert proc.returncode == 2 and "--address: nothing answers" in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and not (tmp_path / "out").exists()
    assert elapsed < RAY_RETRY_S / 2, (
        f"an unreachable address took {elapsed:.1f}s to refuse: not clearly faster than Ray's "
        f"own retries ({RAY_RETRY_S:g} s), which the check before Ray is there to spare"
    )


def test_without_an_address_a_ray_of_its_own_is_started(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not the Ray that `ray start --head` left in /tmp/ray (a bare ray.init() joins it, then
    refuses num_cpus with a traceback)."""
    import ray

    seen: dict[str, object] = {}
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: seen.update(kwargs))
    start_ray(Config(), verbose=False)
    assert seen["address"] == "local" and seen["num_cpus"] >= 3


def test_a_port_that_closes_is_said_so_and_tls_clusters_are_left_to_ray(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A TLS Ray (RAY_USE_TLS) closes a plaintext preface: with it set, only the TCP reach is
    checked; without it, the closing port is refused with what it did."""
    server = _serve(None)
    address = f"127.0.0.1:{server.getsockname()[1]}"
    try:
        with pytest.raises(ConfigError, match="closed the connection without an HTTP/2 answer"):
            check_reachable(address, "--address", "fix")
        monkeypatch.setenv("RAY_USE_TLS", "1")
        check_reachable(address, "--address", "fix")
    finally:
        server.close()
