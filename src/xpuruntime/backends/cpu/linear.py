"""CPU kernels for linear and its backward ops: BLAS through NumPy, fp16 accumulating in fp32."""

from __future__ import annotations

import math

import numpy as np

from ...abi import ArgPack
from ...registry import kernel
from .common import CPU_FLOAT_DTYPES, as_compute

_GELU_C = math.sqrt(2.0 / math.pi)
_GELU_A = 0.044715


def _gelu(z: np.ndarray) -> np.ndarray:
    return 0.5 * z * (1.0 + np.tanh(_GELU_C * (z + _GELU_A * z**3)))


def _gelu_grad(z: np.ndarray) -> np.ndarray:
    t = np.tanh(_GELU_C * (z + _GELU_A * z**3))
    return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * _GELU_C * (1.0 + 3.0 * _GELU_A * z * z)


def _rows(a: np.ndarray) -> np.ndarray:
    """(..., C) -> (M, C) in the compute dtype (a copy only where the view cannot be flattened)."""
    return as_compute(a).reshape(math.prod(a.shape[:-1]), a.shape[-1])


def _store(out: np.ndarray, result: np.ndarray) -> None:
    np.copyto(out, result.reshape(out.shape), casting="same_kind")


def _rows_of(out: np.ndarray, dtype: np.dtype, m: int, n: int) -> np.ndarray | None:
    """`out` viewed as (M, N) when it has the compute dtype and needs no copy for that view, else None."""
    if out.dtype != dtype:
        return None
    try:
        return np.reshape(out, (m, n), copy=False)
    except (ValueError, TypeError):  # a copy would be needed (or NumPy < 2.1 has no copy=)
        return None


def _gelu_inplace(z: np.ndarray) -> None:
    """z <- gelu_tanh(z) with one temporary."""
    f = z.dtype.type
    t = np.multiply(z, z)
    t *= f(_GELU_A)
    t += f(1.0)
    t *= z
    t *= f(_GELU_C)
    np.tanh(t, out=t)
    t += f(1.0)
    t *= f(0.5)
    z *= t


@kernel("linear", "numpy", backend="cpu", dtypes=CPU_FLOAT_DTYPES, priority=10)
def linear_numpy(args: ArgPack) -> None:
    """act(x @ W^T + b) with BLAS, written into `out` when it can be; bias and activation applied in place
    in the compute dtype."""
    x, weight, bias = args.inputs
    x2, w = _rows(x), as_compute(weight)
    z = _rows_of(args.out, x2.dtype, x2.shape[0], w.shape[0])
    direct = z is not None
    if direct:
        np.matmul(x2, w.T, out=z)
    else:
        z = x2 @ w.T
    if bias is not None:
        z += as_compute(bias)
    activation = args.attrs["activation"]
    if activation == "relu":
        np.maximum(z, 0, out=z)
    elif activation == "gelu":
        _gelu_inplace(z)
    if not direct:
        _store(args.out, z)


@kernel("linear_grad_input", "numpy", backend="cpu", dtypes=CPU_FLOAT_DTYPES, priority=10)
def linear_grad_input_numpy(args: ArgPack) -> None:
    """(dy @ W) * act'(preact)."""
    dy, weight, preact = args.inputs
    dx = _rows(dy) @ as_compute(weight)
    activation = args.attrs["activation"]
    if activation == "relu":
        dx *= _rows(preact) > 0
    elif activation == "gelu":
        dx *= _gelu_grad(_rows(preact))
    _store(args.out, dx)


@kernel("linear_grad_weight", "numpy", backend="cpu", dtypes=CPU_FLOAT_DTYPES, priority=10)
def linear_grad_weight_numpy(args: ArgPack) -> None:
    """dy^T @ x; with bias=True packed with the bias gradient (the column sums of dy) after it."""
    dy, x = args.inputs
    dy2 = _rows(dy)
    n, k = args.attrs["n"], args.attrs["k"]
    if not args.attrs["bias"]:
        _store(args.out, dy2.T @ _rows(x))
        return
    _store(args.out[: n * k], (dy2.T @ _rows(x)).ravel())
    _store(args.out[n * k :], dy2.sum(axis=0))


KERNELS = (linear_numpy, linear_grad_input_numpy, linear_grad_weight_numpy)
