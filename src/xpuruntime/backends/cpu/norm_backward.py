"""CPU kernels for layer_norm_backward and rms_norm_backward (float64 math, packed output).

float64 because the gradient of a row whose values nearly coincide (variance below eps) cancels hard:
float32 statistics there were off by 1e-3 relative (hypothesis found the row); the CPU backward is a
reference-grade path, not a hot one."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...abi import ArgPack
from ...registry import kernel
from .common import CPU_FLOAT_DTYPES


def rows64(t: np.ndarray, n: int) -> np.ndarray:
    """t as float64 rows of n elements."""
    return t.astype(np.float64).reshape(-1, n)


def _weight(weight: np.ndarray | None, n: int, offset: float = 0.0) -> np.ndarray | float:
    return 1.0 if weight is None else weight.astype(np.float64).reshape(n) + offset


def store_packed(out: np.ndarray, dx: np.ndarray, *grads: np.ndarray, extra: np.ndarray | None = None) -> None:
    """[dx rows (+ extra, a gradient arriving from elsewhere); grads] into the packed output."""
    m = dx.shape[0]
    if extra is not None:
        dx += extra
    np.copyto(out[:m], dx, casting="same_kind")
    for i, g in enumerate(grads):
        np.copyto(out[m + i], g, casting="same_kind")


def _rounded(y: np.ndarray, dtype: np.dtype, casting: str) -> np.ndarray:
    """y rounded to `dtype` under casting="llama" (the forward rounded there), else y."""
    if casting != "llama" or dtype == np.float64:
        return y
    with np.errstate(over="ignore"):
        return y.astype(dtype).astype(np.float64)


def layer_norm_grads(dy: np.ndarray, x: np.ndarray, w: np.ndarray | float, eps: float) -> tuple[np.ndarray, ...]:
    """(dx, dweight, dbias) of float64 rows: dx = (w*dy - xhat*mean(xhat*w*dy) - mean(w*dy)) * rstd."""
    centered = x - x.mean(axis=1, keepdims=True)
    rstd = 1.0 / np.sqrt(np.square(centered).mean(axis=1, keepdims=True) + eps)
    xhat = centered * rstd
    wdy = dy * w
    dx = (wdy - xhat * (xhat * wdy).mean(axis=1, keepdims=True) - wdy.mean(axis=1, keepdims=True)) * rstd
    return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)


def rms_norm_grads(dy: np.ndarray, x: np.ndarray, w: np.ndarray | float, attrs: Any,
                   dtype: np.dtype) -> tuple[np.ndarray, ...]:  # fmt: skip
    """(dx, dweight) of float64 rows: dx = (w*dy - xhat*mean(xhat*w*dy)) * rstd, dweight = sum(dy*xhat),
    through the forward's roundings to `dtype` under casting="llama"."""
    rstd = 1.0 / np.sqrt(np.square(x).mean(axis=1, keepdims=True) + attrs["eps"])
    xhat = x * rstd
    wdy = _rounded(dy * w, dtype, attrs["casting"])
    dx = (wdy - xhat * (xhat * wdy).mean(axis=1, keepdims=True)) * rstd
    return dx, (dy * _rounded(xhat, dtype, attrs["casting"])).sum(axis=0)


@kernel("layer_norm_backward", "numpy", backend="cpu", dtypes=CPU_FLOAT_DTYPES, priority=10)
def layer_norm_backward_numpy(args: ArgPack) -> None:
    """dx, dweight = sum(dy*xhat), dbias = sum(dy), in float64."""
    dy, x, weight = args.inputs
    n = math.prod(args.attrs["normalized_shape"])
    store_packed(args.out, *layer_norm_grads(rows64(dy, n), rows64(x, n), _weight(weight, n), args.attrs["eps"]))


@kernel("rms_norm_backward", "numpy", backend="cpu", dtypes=CPU_FLOAT_DTYPES, priority=10)
def rms_norm_backward_numpy(args: ArgPack) -> None:
    """dx and dweight = sum(dy*xhat), in float64."""
    dy, x, weight = args.inputs
    at = args.attrs
    n = math.prod(at["normalized_shape"])
    w = _weight(weight, n, at["offset"])
    store_packed(args.out, *rms_norm_grads(rows64(dy, n), rows64(x, n), w, at, x.dtype))
