"""The CPU backend: NumPy kernels for every op. Always available; the reference path for CI."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...registry import Backend

_DTYPES: dict[str, np.dtype] = {}


def empty(shape: tuple[int, ...], dtype: str, device: str, stream: Any = None) -> np.ndarray:
    np_dtype = _DTYPES.get(dtype)
    if np_dtype is None:
        np_dtype = _DTYPES[dtype] = np.dtype(dtype)
    return np.empty(shape, np_dtype)


class CompletedEvent:
    """CPU kernels finish before the launch returns, so their event has always happened."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


_COMPLETED = CompletedEvent()


def record_event(device: str, stream: Any) -> CompletedEvent:
    return _COMPLETED


BACKEND = Backend(
    "cpu", device_type="cpu", empty=empty, record_event=record_event, doc="NumPy kernels; always available."
)
