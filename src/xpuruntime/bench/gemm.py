"""GEMM rows: cuBLASLt matmul against PyTorch's cuBLAS, the fused linear+bias+GELU epilogue against
eager `gelu(linear(x) + b)`, and GEMV (M = 1) against the bandwidth of a plain copy. bf16 throughout."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import Row, Setup, kernel_alternatives


def _needs_cublaslt() -> str | None:
    """Why the cuBLASLt rows cannot run here (no torch, no CUDA, no nvmath), else None."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device"
    import xpuruntime as xrt

    backend = xrt.default_registry().backends.get("cublaslt")
    if backend is None:
        return "the cublaslt backend did not load"
    return backend.unavailable_reason


def _needs_cuda() -> str | None:
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    return None if torch.cuda.is_available() else "no CUDA device"


def _relative_error(got: Any, ref: Any) -> float:
    return float((got.float() - ref.float()).norm() / ref.float().norm())


def _check(ours: Callable[[], Any], reference: Callable[[], Any], tol: float) -> Callable[[], str | None]:
    def check() -> str | None:
        err = _relative_error(ours(), reference())
        return None if err < tol else f"relative error {err:.2e} > {tol:g} against the fp32 reference"

    return check


def _randn(*shape: int, scale: float = 1.0) -> Any:
    import torch

    return (torch.randn(*shape, device="cuda") * scale).to(torch.bfloat16)


def _matmul_setup(size: int) -> Callable[[], Setup]:
    def setup() -> Setup:
        import torch

        import xpuruntime as xrt

        a, b = _randn(size, size), _randn(size, size, scale=size**-0.5)

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

        x, w, bias = _randn(m, k), _randn(n, k, scale=k**-0.5), _randn(n)

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

        v, w = _randn(1, k), _randn(k, n, scale=k**-0.5)
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


ROWS = [
    *(
        Row(f"matmul cublasLt {s}^3 bf16", "gemm", _matmul_setup(s), target=0.97, units="TFLOP/s",
            requires=_needs_cublaslt, doc="policy matmul=cublasLt against torch.matmul (cuBLAS)")
        for s in (4096, 8192)
    ),
    *(
        Row(f"linear+bias+gelu cublasLt {m}x4096x4096 bf16", "gemm", _linear_gelu_setup(m, 4096, 4096), target=1.3,
            units="TFLOP/s", requires=_needs_cublaslt, doc="fused GELU_BIAS against eager gelu(linear(x) + b)")
        for m in (8192, 2048)
    ),
    *(
        Row(f"gemv M=1 {k}x{n} bf16", "gemm", _gemv_setup(k, n), target=0.8, units="TB/s", requires=_needs_cuda,
            doc="matmul of one row by a weight, against the bandwidth of copying that weight")
        for k, n in ((8192, 8192), (4096, 16384))
    ),
]  # fmt: skip
