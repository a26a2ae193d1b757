"""GEMM: cuBLASLt through policy `cublasLt` against PyTorch's cuBLAS, the fused linear + bias + GELU epilogue
against eager `gelu(linear(x) + b)`, our tuned Triton matmul against cuBLAS, and GEMV against the bandwidth of
a plain copy. bf16 throughout."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .common import close, forced, kernel_alternatives, needs_cublaslt, needs_triton, randn
from .row import Row, Setup


def _relative_error(got: Any, ref: Any) -> float:
    return float((got.float() - ref.float()).norm() / ref.float().norm())


def _check(ours: Callable[[], Any], reference: Callable[[], Any], tol: float) -> Callable[[], str | None]:
    def check() -> str | None:
        err = _relative_error(ours(), reference())
        return None if err < tol else f"relative error {err:.2e} > {tol:g} against the fp32 reference"

    return check


def _randn_bf16(*shape: int, scale: float = 1.0) -> Any:
    return randn(*shape, dtype="bfloat16", scale=scale)


def _matmul_setup(size: int) -> Callable[[], Setup]:
    def setup() -> Setup:
        import torch

        import xpuruntime as xrt

        a, b = _randn_bf16(size, size), _randn_bf16(size, size, scale=size**-0.5)

        policy = xrt.KernelPolicy(matmul="cublasLt", strict=True)  # made once: entering its scope is cheap

        def ours() -> Any:
            with xrt.kernel_policy(policy):
                return xrt.ops.matmul(a, b)

        return Setup(
            ours, lambda: torch.matmul(a, b), flops=2 * size**3,
            check=_check(ours, lambda: a.float() @ b.float(), 1e-2),
            alternatives=kernel_alternatives("matmul", lambda: xrt.ops.matmul(a, b), a, b),
        )  # fmt: skip

    return setup


def _linear_gelu_setup(m: int, n: int, k: int) -> Callable[[], Setup]:
    def setup() -> Setup:
        import torch.nn.functional as F

        import xpuruntime as xrt

        x, w, bias = _randn_bf16(m, k), _randn_bf16(n, k, scale=k**-0.5), _randn_bf16(n)

        policy = xrt.KernelPolicy(linear="cublasLt", strict=True)  # made once: entering its scope is cheap

        def ours() -> Any:
            with xrt.kernel_policy(policy):
                return xrt.ops.linear(x, w, bias, "gelu")

        def reference() -> Any:
            return F.gelu(F.linear(x.float(), w.float(), bias.float()), approximate="tanh")

        return Setup(
            ours, lambda: F.gelu(F.linear(x, w) + bias), flops=2 * m * n * k, check=_check(ours, reference, 1e-2),
            alternatives=kernel_alternatives("linear", lambda: xrt.ops.linear(x, w, bias, "gelu"), x, w, bias,
                                             activation="gelu"),
            note="anchor: eager F.gelu(F.linear(x, w) + b), three kernels; ours: one GEMM with the GELU_BIAS "
                 "epilogue (tanh GELU)",
        )  # fmt: skip

    return setup


def _gemv_setup(k: int, n: int) -> Callable[[], Setup]:
    def setup() -> Setup:
        import torch

        import xpuruntime as xrt

        v, w = _randn_bf16(1, k), _randn_bf16(k, n, scale=k**-0.5)
        copy = torch.empty_like(w)
        nbytes = w.numel() * w.element_size()

        def ours() -> Any:
            return xrt.ops.matmul(v, w)

        return Setup(
            ours, lambda: copy.copy_(w), bytes=nbytes, anchor_bytes=2 * nbytes,
            check=_check(ours, lambda: v.float() @ w.float(), 1e-2),
            alternatives=kernel_alternatives("matmul", ours, v, w),
            note="ours: matmul with automatic selection (reads the weight once); anchor: a copy of the weight "
                 "(read + write), the bandwidth ceiling",
        )  # fmt: skip

    return setup


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
    *(
        Row(f"matmul cublasLt {s}^3 bf16", "cublasLt", _matmul_setup(s), target=0.97, units="TFLOP/s",
            requires=needs_cublaslt, anchor="torch.matmul (cuBLAS)", doc="policy matmul=cublasLt")
        for s in (4096, 8192)
    ),
    *(
        Row(f"linear+bias+gelu cublasLt {m}x4096x4096 bf16", "cublasLt", _linear_gelu_setup(m, 4096, 4096),
            target=1.3, units="TFLOP/s", requires=needs_cublaslt, anchor="eager gelu(linear(x) + b)",
            doc="one GEMM with the GELU_BIAS epilogue")
        for m in (8192, 2048)
    ),
    *(
        Row(f"gemv M=1 {k}x{n} bf16", "gemv", _gemv_setup(k, n), target=0.8, units="TB/s", requires=needs_triton,
            anchor="copy of the weight", doc="matmul of one row by a weight, automatic selection")
        for k, n in ((8192, 8192), (4096, 16384))
    ),
    *(
        Row(f"triton matmul {n}^3 bf16", "triton", lambda n=n: _matmul(n), target=0.85, units="TFLOP/s",
            requires=needs_triton, anchor="torch.matmul (cuBLAS)", doc="tuned Triton tiles")
        for n in (4096, 8192)
    ),
    Row(f"gemv {G}x{G} @ x bf16 vs copy", "gemv", lambda: _gemv(True), target=0.8, requires=needs_triton,
        anchor="copy of the matrix", doc="Triton GEMV, N = 1"),
    Row(f"gemv x @ {G}x{G} bf16 vs copy", "gemv", lambda: _gemv(False), target=0.8, requires=needs_triton,
        anchor="copy of the matrix", doc="Triton GEMV, M = 1"),
    Row(f"gemv {G}x{G} @ x bf16 vs cuBLAS", "gemv", _gemv_vs_cublas, requires=needs_triton, anchor="torch.mv",
        doc="Triton GEMV, no target"),
]  # fmt: skip
