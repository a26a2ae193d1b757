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


def as_compute(x: np.ndarray | None) -> np.ndarray | None:
    return None if x is None else x.astype(compute_dtype(x.dtype), copy=False)
