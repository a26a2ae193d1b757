"""Benchmark rows: the tuned Triton matmul beside cuBLAS, and the Triton GEMV beside copy bandwidth."""

from __future__ import annotations

from . import Row, Setup, kernel_alternatives
from ._triton_rows import close, forced, needs_cuda, randn


def _matmul(n: int) -> Setup:
    import torch

    import xpuruntime as xrt

    a, b = randn(n, n, dtype="bfloat16"), randn(n, n, dtype="bfloat16")
    call = lambda: xrt.ops.matmul(a, b)  # noqa: E731
    ours = forced("matmul", "triton", call)
    return Setup(
        ours=ours, anchor=lambda: torch.matmul(a, b), flops=2 * n**3,
        check=lambda: close(ours(), torch.matmul(a, b), 1e-2),
        alternatives=kernel_alternatives("matmul", call, a, b),
        note="first call tunes BM/BN/BK/warps/stages (winner kept in the tuning cache)",
    )  # fmt: skip


G = 16384


def _gemv(column: bool) -> Setup:
    """y = A x (N == 1) or y = x B (M == 1) with a bf16 16384x16384 matrix; anchor: copying that matrix."""
    import torch

    import xpuruntime as xrt

    w, v = randn(G, G, dtype="bfloat16"), randn(G, dtype="bfloat16")
    dst = torch.empty_like(w)
    call = (lambda: xrt.ops.matmul(w, v)) if column else (lambda: xrt.ops.matmul(v, w))
    ours = forced("matmul", "triton_gemv" if column else "triton_gemv_t", call, *((w, v) if column else (v, w)))
    reference = (lambda: torch.mv(w, v)) if column else (lambda: v @ w)
    return Setup(
        ours=ours, anchor=lambda: dst.copy_(w), bytes=2 * (G * G + 2 * G), anchor_bytes=2 * 2 * G * G,
        check=lambda: close(ours(), reference(), 1e-2),
        alternatives=kernel_alternatives("matmul", call, *((w, v) if column else (v, w))),
        note="anchor: device-to-device copy of the matrix (bytes read + written)",
    )  # fmt: skip


def _gemv_vs_cublas() -> Setup:
    import torch

    import xpuruntime as xrt

    w, v = randn(G, G, dtype="bfloat16"), randn(G, dtype="bfloat16")
    ours = forced("matmul", "triton_gemv", lambda: xrt.ops.matmul(w, v), w, v)
    return Setup(ours=ours, anchor=lambda: torch.mv(w, v), bytes=2 * (G * G + 2 * G))


ROWS = [
    Row("triton matmul 4096^3 bf16", "gemm", lambda: _matmul(4096), target=0.85, units="TFLOP/s",
        requires=needs_cuda, doc="tuned Triton tiles vs torch.matmul (cuBLAS)"),
    Row("triton matmul 8192^3 bf16", "gemm", lambda: _matmul(8192), target=0.85, units="TFLOP/s",
        requires=needs_cuda, doc="tuned Triton tiles vs torch.matmul (cuBLAS)"),
    Row(f"gemv {G}x{G} @ x bf16 vs copy", "gemv", lambda: _gemv(True), target=0.8, requires=needs_cuda,
        doc="Triton GEMV (N == 1) vs copy bandwidth"),
    Row(f"gemv x @ {G}x{G} bf16 vs copy", "gemv", lambda: _gemv(False), target=0.8, requires=needs_cuda,
        doc="Triton GEMV (M == 1) vs copy bandwidth"),
    Row(f"gemv {G}x{G} @ x bf16 vs cuBLAS", "gemv", _gemv_vs_cublas, requires=needs_cuda,
        doc="Triton GEMV vs torch.mv (no target)"),
]  # fmt: skip
