"""Helpers shared by the CPU kernels."""

from __future__ import annotations

import numpy as np

from ...abi import INT_DTYPES

CPU_FLOAT_DTYPES = frozenset({"float16", "float32", "float64"})  # NumPy has no native bfloat16
__all__ = ["CPU_FLOAT_DTYPES", "INT_DTYPES", "as_compute", "compute_dtype"]


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """Accumulation dtype, in native byte order: fp16 computes in fp32 (mixed precision), everything
    else in itself."""
    native = dtype.newbyteorder("=")
    return np.dtype(np.float32) if native == np.float16 else native


def as_compute(x: np.ndarray | None, dtype: np.dtype | None = None) -> np.ndarray | None:
    return None if x is None else x.astype(dtype or compute_dtype(x.dtype), copy=False)


def score_dtype(q: np.ndarray, k: np.ndarray, scale: float) -> np.dtype:
    """Attention's compute dtype, or float64 when scale * q . k could overflow it (a scale of 1e38 on
    float32): the softmax of such scores is finite, but inf - inf in the row max would make it NaN."""
    dtype = compute_dtype(q.dtype)
    if dtype == np.float64 or not q.size or not k.size:
        return dtype
    with np.errstate(over="ignore", invalid="ignore"):
        bound = abs(scale) * float(np.abs(q).max()) * float(np.abs(k).max()) * q.shape[-1]
    return dtype if bound < float(np.finfo(dtype).max) / 16 else np.dtype(np.float64)
