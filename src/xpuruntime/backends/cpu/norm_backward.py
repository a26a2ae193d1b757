"""CPU kernels for layer_norm_backward and rms_norm_backward (float64 math, packed output).

float64 because the gradient of a row whose values nearly coincide (variance below eps) cancels hard:
float32 statistics there were off by 1e-3 relative (hypothesis found the row); the CPU backward is a
reference-grade path, not a hot one."""

from __future__ import annotations

import math

import numpy as np

from ...abi import ArgPack
from ...registry import kernel
from .common import CPU_FLOAT_DTYPES


def _rows(args: ArgPack) -> tuple[np.ndarray, np.ndarray, np.ndarray | float, int]:
    dy, x, weight = args.inputs
    n = math.prod(args.attrs["normalized_shape"])
    w = 1.0 if weight is None else weight.astype(np.float64).reshape(n)
    return dy.astype(np.float64).reshape(-1, n), x.astype(np.float64).reshape(-1, n), w, n


def _store(out: np.ndarray, dx: np.ndarray, *grads: np.ndarray) -> None:
    m = dx.shape[0]
    np.copyto(out[:m], dx, casting="same_kind")
    for i, g in enumerate(grads):
        np.copyto(out[m + i], g, casting="same_kind")


@kernel("layer_norm_backward", "numpy", backend="cpu", dtypes=CPU_FLOAT_DTYPES, priority=10)
def layer_norm_backward_numpy(args: ArgPack) -> None:
    """dx = (w*dy - xhat*mean(xhat*w*dy) - mean(w*dy)) * rstd; dweight = sum(dy*xhat); dbias = sum(dy)."""
    dy, x, w, _ = _rows(args)
    centered = x - x.mean(axis=1, keepdims=True)
    rstd = 1.0 / np.sqrt(np.square(centered).mean(axis=1, keepdims=True) + args.attrs["eps"])
    xhat = centered * rstd
    wdy = dy * w
    dx = (wdy - xhat * (xhat * wdy).mean(axis=1, keepdims=True) - wdy.mean(axis=1, keepdims=True)) * rstd
    _store(args.out, dx, (dy * xhat).sum(axis=0), dy.sum(axis=0))


@kernel("rms_norm_backward", "numpy", backend="cpu", dtypes=CPU_FLOAT_DTYPES, priority=10)
def rms_norm_backward_numpy(args: ArgPack) -> None:
    """dx = (w*dy - xhat*mean(xhat*w*dy)) * rstd; dweight = sum(dy*xhat)."""
    dy, x, w, _ = _rows(args)
    rstd = 1.0 / np.sqrt(np.square(x).mean(axis=1, keepdims=True) + args.attrs["eps"])
    xhat = x * rstd
    wdy = dy * w
    dx = (wdy - xhat * (xhat * wdy).mean(axis=1, keepdims=True)) * rstd
    _store(args.out, dx, (dy * xhat).sum(axis=0))
