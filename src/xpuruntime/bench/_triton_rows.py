"""Shared pieces of the Triton benchmark rows: device check, random data, forced-kernel calls."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def needs_cuda() -> str | None:
    """Why a GPU row cannot run here, or None."""
    try:
        import torch
        import triton  # noqa: F401
    except ImportError as exc:
        return f"needs PyTorch and Triton ({exc})"
    return None if torch.cuda.is_available() else "needs a CUDA GPU"


def randn(*shape: int, dtype: str = "float32", scale: float = 1.0, shift: float = 0.0) -> Any:
    """Random normal data on the GPU (never zeros)."""
    import torch

    return (torch.randn(*shape, device="cuda", dtype=torch.float32) * scale + shift).to(getattr(torch, dtype))


def forced(op: str, kernel: str, call: Callable[[], Any], *inputs: Any, **attrs: Any) -> Callable[[], Any]:
    """`call` itself when automatic selection already picks `kernel` for these inputs (the user's path, no
    policy scope to pay for), else `call` under a strict policy naming it."""
    import xpuruntime as xrt

    if inputs and xrt.explain(op, *inputs, show=False, **attrs).selected == kernel:
        return call
    policy = xrt.KernelPolicy(strict=True, **{op: kernel})

    def run() -> Any:
        with xrt.kernel_policy(policy):
            return call()

    return run


def close(a: Any, b: Any, tol: float) -> str | None:
    """A message when max|a - b| / max|b| exceeds tol (or NaN appears), else None."""
    a, b = a.float(), b.float()
    if a.isnan().any():
        return "NaN in our output"
    err = ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
    return None if err <= tol else f"relative difference {err:.2e} > {tol:.0e} from the anchor"
