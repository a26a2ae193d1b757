"""Helpers the row modules share: why a row cannot run here, random GPU data, result checks, and calls that
force one kernel (or every supported kernel) by policy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def needs_cuda() -> str | None:
    """Why a row that needs PyTorch with a CUDA device cannot run here, or None."""
    try:
        import torch
    except ImportError:
        return "needs PyTorch"
    return None if torch.cuda.is_available() else "needs a CUDA GPU"


def needs_triton() -> str | None:
    """Why a row of our Triton kernels cannot run here (no PyTorch, Triton or CUDA device), or None."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return "needs Triton"
    return needs_cuda()


def needs_cublaslt() -> str | None:
    """Why a cuBLASLt row cannot run here (no CUDA device, no nvmath-python), or None."""
    missing = needs_cuda()
    if missing:
        return missing
    import xpuruntime as xrt

    backend = xrt.default_registry().backends.get("cublaslt")
    if backend is None:
        return "the cublaslt backend did not load"
    return backend.unavailable_reason


def needs_onnxruntime() -> str | None:
    """Why a row comparing with onnxruntime cannot run here, or None."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return 'needs onnxruntime (pip install "onnxruntime")'
    return None


def randn(*shape: int, dtype: str = "float32", scale: float = 1.0, shift: float = 0.0) -> Any:
    """Random normal data on the GPU (never zeros)."""
    import torch

    return (torch.randn(*shape, device="cuda", dtype=torch.float32) * scale + shift).to(getattr(torch, dtype))


def close(a: Any, b: Any, tol: float) -> str | None:
    """A message when max|a - b| / max|b| exceeds tol (or NaN appears), else None."""
    a, b = a.float(), b.float()
    if a.isnan().any():
        return "NaN in our output"
    err = ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
    return None if err <= tol else f"relative difference {err:.2e} > {tol:.0e} from the anchor"


def forced(op: str, kernel: str, call: Callable[[], Any], *inputs: Any, **attrs: Any) -> Callable[[], Any]:
    """`call` itself when automatic selection already picks `kernel` for these inputs (the user's path, no
    policy scope to pay for), else `call` under a strict policy naming it."""
    import xpuruntime as xrt

    if inputs and xrt.explain(op, *inputs, show=False, **attrs).selected == kernel:
        return call
    policy = xrt.KernelPolicy(strict=True, **{op: kernel})  # made once: entering its scope is cheap

    def run() -> Any:
        with xrt.kernel_policy(policy):
            return call()

    return run


def kernel_alternatives(op: str, call: Callable[[], Any], *inputs: Any, **attrs: Any) -> dict[str, Callable[[], Any]]:
    """One callable per registered kernel that supports this call (`inputs`/`attrs` as for `explain`), each
    running `call` under a strict policy naming that kernel, and "auto": `call` itself (no policy). Put them
    in `Setup.alternatives`: the report shows how close auto (and autotune, where a row adds it) comes to the
    fastest kernel."""
    import xpuruntime as xrt

    explanation = xrt.explain(op, *inputs, show=False, **attrs)
    names = [c.kernel.name for c in explanation.candidates if c.supported]

    def forced_kernel(name: str) -> Callable[[], Any]:
        policy = xrt.KernelPolicy(strict=True, **{op: name})

        def run_forced() -> Any:
            with xrt.kernel_policy(policy):
                return call()

        return run_forced

    return {**{name: forced_kernel(name) for name in names}, "auto": call}
