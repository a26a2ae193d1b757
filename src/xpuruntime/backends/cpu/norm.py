"""CPU kernels for layer_norm and rms_norm (two-pass statistics, fp32 accumulation for fp16)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ...abi import ArgPack
from ...registry import kernel
from .common import CPU_FLOAT_DTYPES, as_compute, compute_dtype

_vecdot = getattr(np, "vecdot", None)  # NumPy >= 2.0: a row-wise dot product in one pass


def _axes(x: np.ndarray, normalized_shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(range(x.ndim - len(normalized_shape), x.ndim))


def _affine_into(out: np.ndarray, y: np.ndarray, weight: np.ndarray | None, bias: np.ndarray | None) -> None:
    if weight is not None:
        y *= as_compute(weight)
    if bias is not None:
        y += as_compute(bias)
    if y is not out:
        np.copyto(out, y, casting="same_kind")


def _sum(x: np.ndarray, axes: tuple[int, ...], cdt: np.dtype) -> np.ndarray:
    """Sum of x over `axes` (kept) in `cdt`: over one axis as a matrix-vector product with ones (BLAS),
    several times faster than a NumPy reduction over short rows."""
    if len(axes) == 1 and x.dtype == cdt:
        return np.matmul(x, np.ones(x.shape[-1], cdt))[..., None]
    return np.add.reduce(x, axis=axes, keepdims=True, dtype=cdt)


def _sum_of_squares(y: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """Sum of y*y over `axes` (kept): one pass over the last axis where NumPy has vecdot."""
    if len(axes) == 1 and _vecdot is not None:
        return _vecdot(y, y)[..., None]
    return np.add.reduce(np.square(y), axis=axes, keepdims=True)


def _aliases(out: np.ndarray, *params: np.ndarray | None) -> bool:
    """Whether `out` shares memory with any of the (optional) parameter arrays."""
    return any(p is not None and np.may_share_memory(out, p) for p in params)


def layer_norm_into(out: np.ndarray, x: np.ndarray, weight: np.ndarray | None, bias: np.ndarray | None,
                    eps: float, axes: tuple[int, ...]) -> None:  # fmt: skip
    """Layer norm of x over `axes` into `out`: mean, then variance of the centered values (no
    E[x^2]-E[x]^2 cancellation), computed in `out` when it has the compute dtype. In-place safe."""
    if out.size == 0:
        return
    cdt = compute_dtype(x.dtype)
    inv_n = cdt.type(1.0 / math.prod(x.shape[a] for a in axes))
    mean = _sum(x, axes, cdt)
    mean *= inv_n
    # the sums' order depends on the layout: keep one; `out` may be weight's or bias's very view (in-place
    # rule), which must stay unwritten until the affine step reads it
    direct = out.dtype == cdt and out.flags.c_contiguous and not _aliases(out, weight, bias)
    y = out if direct else np.empty(out.shape, cdt)
    np.subtract(x, mean, out=y)
    rstd = _sum_of_squares(y, axes)
    rstd *= inv_n
    rstd += cdt.type(eps)
    np.sqrt(rstd, out=rstd)
    np.reciprocal(rstd, out=rstd)
    y *= rstd
    _affine_into(out, y, weight, bias)


def rms_norm_into(out: np.ndarray, x: np.ndarray, weight: np.ndarray | None, attrs: Mapping[str, Any],
                  axes: tuple[int, ...]) -> None:  # fmt: skip
    """x / sqrt(mean(x^2) + eps) * (weight + offset) into `out`, rounded to x's dtype before the weight
    under casting="llama" (ops/norm.py). In-place safe."""
    xf = as_compute(x)
    mean_square = np.mean(np.square(xf), axis=axes, keepdims=True)
    y = xf * (1.0 / np.sqrt(mean_square + attrs["eps"]))
    if attrs["casting"] == "llama" and x.dtype != y.dtype:
        with np.errstate(over="ignore"):
            y = y.astype(x.dtype).astype(y.dtype)
    if weight is not None and attrs["offset"]:
        weight = as_compute(weight) + y.dtype.type(attrs["offset"])
    _affine_into(out, y, weight, None)


@kernel("layer_norm", "numpy", backend="cpu", dtypes=CPU_FLOAT_DTYPES, priority=10)
def layer_norm_numpy(args: ArgPack) -> None:
    """Mean, then variance of the centered values (no E[x^2]-E[x]^2 cancellation). In-place safe."""
    x, weight, bias = args.inputs
    layer_norm_into(args.out, x, weight, bias, args.attrs["eps"], _axes(x, args.attrs["normalized_shape"]))


@kernel("rms_norm", "numpy", backend="cpu", dtypes=CPU_FLOAT_DTYPES, priority=10)
def rms_norm_numpy(args: ArgPack) -> None:
    """x / sqrt(mean(x^2) + eps) * (weight + offset). In-place safe."""
    x, weight = args.inputs
    rms_norm_into(args.out, x, weight, args.attrs, _axes(x, args.attrs["normalized_shape"]))
