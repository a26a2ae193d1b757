"""Elementwise and reductions: the fused elementwise `sin(a*x+b)` and the row sum (Triton) against PyTorch's
eager kernels and torch.compile."""

from __future__ import annotations

from .common import close, forced, kernel_alternatives, needs_triton, randn
from .row import Row, Setup

M, N = 8192, 8192
A, B = 1.7, -0.3


def _sin_affine(compiled: bool) -> Setup:
    import torch

    import xpuruntime as xrt

    x = randn(M, N)
    call = lambda: xrt.ops.sin_affine(x, A, B)  # noqa: E731
    ours = forced("sin_affine", "triton", call, x, A, B)
    eager = lambda: torch.sin(A * x + B)  # noqa: E731
    anchor = torch.compile(eager) if compiled else eager
    return Setup(
        ours=ours, anchor=anchor, bytes=2 * 4 * M * N, check=lambda: close(ours(), eager(), 1e-5),
        alternatives=kernel_alternatives("sin_affine", call, x, A, B) if not compiled else {},
    )  # fmt: skip


def _sum_rows() -> Setup:
    import torch

    import xpuruntime as xrt

    x = randn(M, N, shift=0.5)
    call = lambda: xrt.ops.sum(x, -1)  # noqa: E731
    ours = forced("sum", "triton", call, x, axis=-1)
    return Setup(
        ours=ours, anchor=lambda: torch.sum(x, -1), bytes=4 * (M * N + M),
        check=lambda: close(ours(), x.double().sum(-1), 1e-5),
        alternatives=kernel_alternatives("sum", call, x, axis=-1),
    )  # fmt: skip


ROWS = [
    Row(f"sin_affine {M}x{N} fp32 vs eager", "elementwise", lambda: _sin_affine(False), target=2.7,
        target_kind="TB/s", requires=needs_triton, anchor="eager torch.sin(a * x + b)", doc="one Triton kernel"),
    Row(f"sin_affine {M}x{N} fp32 vs torch.compile", "elementwise", lambda: _sin_affine(True),
        requires=needs_triton, anchor="torch.compile of the same", doc="one Triton kernel"),
    Row(f"sum(-1) {M}x{N} fp32", "reduction", _sum_rows, target=0.95, requires=needs_triton,
        anchor="torch.sum", doc="Triton row sum"),
]  # fmt: skip
