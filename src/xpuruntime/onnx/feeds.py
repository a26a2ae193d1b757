"""Checks of a run's inputs against the graph's declared inputs, shared by the runners: dtype, rank, fixed
dims, and symbolic dims that must agree between inputs. Errors name the input and what was expected."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import DTypeError, ShapeError
from ..graph.ir import Value
from .errors import InputFeedError
from .ops.record import dtype_name


def check_arrays(inputs: tuple[Value, ...], feed: Mapping[str, Any]) -> list[np.ndarray]:
    """The fed values of `inputs`, in order, as C-contiguous NumPy arrays of the declared dtypes and shapes."""
    symbols: dict[str, tuple[str, int]] = {}
    return [_check_array(v, feed[v.name], symbols) for v in inputs]


def check_tensors(inputs: tuple[Value, ...], feed: Mapping[str, Any]) -> list[Any]:
    """The fed tensors (any array type with dtype and shape) of `inputs`, in order, checked as above."""
    symbols: dict[str, tuple[str, int]] = {}
    found = []
    for v in inputs:
        t = feed[v.name]
        if v.dtype is not None and dtype_name(t) != v.dtype:
            raise DTypeError(f"run: input '{v.name}' expected dtype {v.dtype}, got {dtype_name(t)}")
        check_shape(v, tuple(t.shape), symbols)
        found.append(t)
    return found


def _check_array(v: Value, value: Any, symbols: dict[str, tuple[str, int]]) -> np.ndarray:
    try:
        array = np.asarray(value)
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
    except Exception as exc:
        raise InputFeedError(f"run: input '{v.name}' cannot be converted to an array: {exc}") from None
    if v.dtype is not None and array.dtype.name != v.dtype:
        raise DTypeError(f"run: input '{v.name}' expected dtype {v.dtype}, got {array.dtype.name}")
    check_shape(v, array.shape, symbols)
    return array


def check_shape(v: Value, shape: tuple[int, ...], symbols: dict[str, tuple[str, int]]) -> None:
    """Rank, fixed dims and symbolic dims shared between inputs; errors name the input and the dim."""
    if v.shape is None:
        return
    if len(shape) != len(v.shape):
        raise ShapeError(
            f"run: input '{v.name}' expected rank {len(v.shape)} (shape {list(v.shape)}), got shape {list(shape)}"
        )
    for axis, (want, got) in enumerate(zip(v.shape, shape)):
        if isinstance(want, int) and want != got:
            raise ShapeError(
                f"run: input '{v.name}' expected size {want} on dim {axis} (shape {list(v.shape)}), "
                f"got shape {list(shape)}"
            )
        if isinstance(want, str):
            seen = symbols.setdefault(want, (v.name, got))
            if seen[1] != got:
                raise ShapeError(
                    f"run: input '{v.name}' dim {axis} ('{want}') is {got}, "
                    f"but input '{seen[0]}' has '{want}' = {seen[1]}"
                )
