"""The CPU backend: NumPy kernels for every op. Always available; the reference path for CI."""

from __future__ import annotations

import numpy as np

from ...registry import Backend
from . import attention, elementwise, matmul, norm, reduction, softmax

_DTYPES: dict[str, np.dtype] = {}


def empty(shape: tuple[int, ...], dtype: str, device: str) -> np.ndarray:
    np_dtype = _DTYPES.get(dtype)
    if np_dtype is None:
        np_dtype = _DTYPES[dtype] = np.dtype(dtype)
    return np.empty(shape, np_dtype)


BACKEND = Backend("cpu", device_type="cpu", empty=empty, doc="NumPy kernels; always available.")

KERNELS = (
    *elementwise.KERNELS,
    *reduction.KERNELS,
    *matmul.KERNELS,
    *softmax.KERNELS,
    *norm.KERNELS,
    *attention.KERNELS,
)
