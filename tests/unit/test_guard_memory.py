"""The correctness guard squares gradients in float64 (``train_fns.guard``): a whole large
gradient copied to float64 needs twice its fp32 size again (four times a bf16 one's), twice
over with its square, in the warm-up of a model that fits training. It squares a bounded
number of rows at a time; measured here as the process's resident peak (``VmHWM``)."""

from __future__ import annotations

import torch

from train_fns.guard import shard_squares
from train_fns.timing import peak_memory_bytes, reset_peak_memory

CPU = torch.device("cpu")
MiB = 2**20


def test_shard_squares_of_a_large_gradient_need_no_float64_copy_of_it() -> None:
    """The least of three measured peaks: the resident high-water mark also moves with the
    first call's code pages and the allocator's arenas, noise a float64 copy of the gradient
    (128 MiB, and as much again for its square) would show through in every one of them."""
    grad = torch.randn(4096, 4096)  # 64 MiB in fp32; a float64 copy is 128 MiB
    grad.mul_(1.0)  # its pages resident before the peak is reset
    shard_squares(grad[:8], 2, CPU)  # the kernels' code paged in
    extras = []
    for _ in range(3):
        reset_peak_memory(CPU)
        before = peak_memory_bytes(CPU)
        squares = shard_squares(grad, 2, CPU)
        extras.append(peak_memory_bytes(CPU) - before)
    assert min(extras) < 48 * MiB, f"{min(extras) / MiB:.0f} MiB over the gradient's own 64 MiB"
    exact = grad.double().pow(2).reshape(2, -1).sum(1)
    assert torch.allclose(squares, exact, rtol=1e-12)


def test_row_squares_of_empty_and_scalar_gradients() -> None:
    """An FSDP rank's shard of a parameter with fewer rows than ranks is empty."""
    from train_fns.guard import row_squares

    assert row_squares(torch.zeros(0, 4)).shape == (0,)
    assert row_squares(torch.zeros(0)).shape == (0,)
    assert row_squares(torch.tensor(3.0)).tolist() == [9.0]
