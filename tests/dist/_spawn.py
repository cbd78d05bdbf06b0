"""Spawn helpers for the distributed tests: torch.multiprocessing + gloo on CPU.

All process-group plumbing lives here so that a torch upgrade touches one file. A worker
function is ``fn(rank, world_size, *args) -> picklable`` defined at module level of a test
module (spawned children import it by name); its return values come back in rank order.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _placement import SimulatedAccelerator, check_collectives
from torch.distributed.tensor import DTensor

from train_fns.weights import canonical_name

WORLD_SIZE = 2
FORKSERVER = mp.get_context("forkserver")
"""Ranks fork from one server that imported torch, transformers and train_fns once: a spawned
rank re-imported them (4-5 s a rank on 2 cores: two dist files took 37.5 s spawned, 19.2 s
forked). The server is forked before any rank runs a collective or a thread pool, so each
rank starts clean."""
FORKSERVER.set_forkserver_preload(
    ["torch", "torch.distributed.fsdp", "transformers", "train_fns.loop", "_placement"]
)


def free_port() -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _entry(
    rank: int,
    fn: Callable,
    world_size: int,
    port: int,
    out_dir: str,
    args: tuple,
    environ: dict[str, str],
    simulate_gpu: bool = False,
) -> None:
    # The server's environment is the one it started with: take the test's, as spawn did.
    os.environ.clear()
    os.environ.update(environ)
    # Two workers on a 2-core machine: one thread each, or they fight for cores.
    torch.set_num_threads(1)
    check_collectives()  # every dist test checks where collective tensors live
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    # On an exception the process just exits: a clean destroy would wait for a peer that may
    # itself be blocked in a collective, turning one failure into a hang.
    with SimulatedAccelerator() if simulate_gpu else contextlib.nullcontext():
        result = fn(rank, world_size, *args)
    dist.destroy_process_group()
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    # The result is saved: leave without the interpreter's teardown. A rank aborted once in a
    # CI run ("terminate called without an active exception", SIGABRT, after an FSDP2
    # checkpoint load; not seen in 4 reruns): a C++ thread still joinable when the process
    # exits is the usual cause, and nothing after the save can matter to the test.
    os._exit(0)


def _entry_to_exit(*args: Any) -> None:
    """``_entry`` for a rank expected to fail: an exception ends it as an uncaught one would
    (its traceback, exit code 1) but without the interpreter's teardown, where a gloo thread
    still holding work aborted a CI run's raising rank (SIGABRT, exit -6, "terminate called
    without an active exception"; see ``_entry``'s end)."""
    try:
        _entry(*args)
    except Exception:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def run_distributed(
    fn: Callable,
    *args: Any,
    world_size: int = WORLD_SIZE,
    timeout_s: float = 120.0,
    simulate_gpu: bool = False,
) -> list[Any]:
    """Run ``fn`` on ``world_size`` gloo ranks; returns each rank's result, rank order.

    Raises if a rank fails (with its traceback) or the group does not finish in time.
    ``simulate_gpu`` runs ``fn`` as a GPU worker would place its tensors (``_placement``).
    """
    with tempfile.TemporaryDirectory(prefix="commtune-dist-") as out_dir:
        context = mp.start_processes(
            _entry,
            args=(fn, world_size, free_port(), out_dir, args, dict(os.environ), simulate_gpu),
            nprocs=world_size,
            join=False,
            start_method="forkserver",
        )
        deadline = time.monotonic() + timeout_s
        while not context.join(timeout=1.0):
            if time.monotonic() > deadline:
                for process in context.processes:
                    if process.is_alive():
                        process.kill()
                raise TimeoutError(f"distributed test did not finish in {timeout_s}s")
        return [
            torch.load(Path(out_dir) / f"rank{rank}.pt", weights_only=False)
            for rank in range(world_size)
        ]


def full_gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's full gradient by canonical name (a collective under FSDP2)."""
    grads = {}
    for name, param in model.named_parameters():
        grad = param.grad
        if isinstance(grad, DTensor):
            grad = grad.full_tensor()
        grads[canonical_name(name)] = grad.detach().clone()
    return grads


def run_to_exit(
    fn: Callable, *args: Any, world_size: int = WORLD_SIZE, timeout_s: float = 60.0
) -> list[int | None]:
    """Run ``fn`` on ``world_size`` gloo ranks expecting failures; returns their exit codes.

    For fault tests: a rank may crash, raise or be ended by its watchdog. A rank still alive
    at ``timeout_s`` is killed and reported as None.
    """
    # Spawned, not forked from the server: a fork takes the server's stderr, and these tests
    # read what the ranks print (capfd) from the test's own.
    context = mp.get_context("spawn")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="commtune-dist-") as out_dir:
        processes = [
            context.Process(
                target=_entry_to_exit,
                args=(rank, fn, world_size, port, out_dir, args, dict(os.environ)),
            )
            for rank in range(world_size)
        ]
        for process in processes:
            process.start()
        deadline = time.monotonic() + timeout_s
        for process in processes:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
        codes = [process.exitcode for process in processes]
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join()
        return codes
