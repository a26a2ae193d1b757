"""CPU kernels for layer_norm and rms_norm (two-pass statistics, fp32 accumulation for fp16)."""

from __future__ import annotations

import numpy as np

from ...abi import ArgPack
from ...registry import kernel
from .common import CPU_FLOAT_DTYPES, as_compute


def _axes(x: np.ndarray, normalized_shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(range(x.ndim - len(normalized_shape), x.ndim))


def _affine_into(out: np.ndarray, y: np.ndarray, weight: np.ndarray | None, bias: np.ndarray | None) -> None:
    if weight is not None:
        y *= as_compute(weight)
    if bias is not None:
        y += as_compute(bias)
    np.copyto(out, y, casting="same_kind")


@kernel("layer_norm", "numpy", backend="cpu", dtypes=CPU_FLOAT_DTYPES, priority=10)
def layer_norm_numpy(args: ArgPack) -> None:
    """Mean, then variance of the centered values (no E[x^2]-E[x]^2 cancellation). In-place safe."""
    x, weight, bias = args.inputs
    axes = _axes(x, args.attrs["normalized_shape"])
    xf = as_compute(x)
    centered = xf - xf.mean(axis=axes, keepdims=True)
    variance = np.mean(np.square(centered), axis=axes, keepdims=True)
    centered *= 1.0 / np.sqrt(variance + args.attrs["eps"])
    _affine_into(args.out, centered, weight, bias)


@kernel("rms_norm", "numpy", backend="cpu", dtypes=CPU_FLOAT_DTYPES, priority=10)
def rms_norm_numpy(args: ArgPack) -> None:
    """x / sqrt(mean(x^2) + eps) * weight. In-place safe."""
    x, weight = args.inputs
    xf = as_compute(x)
    mean_square = np.mean(np.square(xf), axis=_axes(x, args.attrs["normalized_shape"]), keepdims=True)
    _affine_into(args.out, xf * (1.0 / np.sqrt(mean_square + args.attrs["eps"])), weight, None)
