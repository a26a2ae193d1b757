"""Validation helpers shared by op schemas. Each raises an error naming op, argument and expectation."""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..abi import FLOAT_DTYPES, INT_DTYPES
from ..context import DispatchContext
from ..errors import ArgumentError, DTypeError, ShapeError, argument_error, clip

__all__ = [
    "FLOAT_DTYPES",
    "INT_DTYPES",
    "broadcast",
    "finite_float",
    "int_attribute",
    "normalize_axis",
    "numel",
    "require_dtype_like",
    "require_float",
    "require_ndim",
    "stored_as",
]  # fmt: skip


def require_float(ctx: DispatchContext, name: str) -> str:
    dtype = ctx.tensor(name).dtype
    if dtype not in FLOAT_DTYPES:
        raise argument_error(DTypeError, ctx.op, name, f"a floating dtype ({', '.join(sorted(FLOAT_DTYPES))})", dtype)
    return dtype


def require_dtype_like(ctx: DispatchContext, name: str, like: str) -> None:
    """Tensor `name`, when present, must have the same dtype as `like` (no implicit promotion)."""
    if ctx.has_tensor(name) and ctx.tensor(name).dtype != ctx.tensor(like).dtype:
        expected = f"dtype {ctx.tensor(like).dtype} (same as '{like}')"
        raise argument_error(DTypeError, ctx.op, name, expected, ctx.tensor(name).dtype)


def require_ndim(ctx: DispatchContext, name: str, minimum: int) -> None:
    ndim = ctx.tensor(name).ndim
    if ndim < minimum:
        raise argument_error(ShapeError, ctx.op, name, f"at least {minimum} dimension(s)", f"{ndim}-d")


def finite_float(op: str, name: str, value: Any, expected: str, minimum: float = -math.inf) -> float:
    """A real number attribute as a finite float >= `minimum`: bools, NaN, infinities and integers beyond the
    float range (10**400) raise an ArgumentError naming the argument."""
    try:
        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            raise TypeError
        number = float(value)  # OverflowError for an int beyond 1.8e308
    except (TypeError, ValueError, OverflowError):
        raise argument_error(ArgumentError, op, name, expected, clip(value)) from None
    if not math.isfinite(number) or number < minimum:
        raise argument_error(ArgumentError, op, name, expected, clip(value))
    return number


def int_attribute(ctx: DispatchContext, name: str) -> int:
    """The attribute `name` as an int (NumPy integers too; never a bool, which Python counts as an int)."""
    raw = ctx.attrs[name]
    try:
        if isinstance(raw, bool):
            raise TypeError
        return operator.index(raw)
    except TypeError:
        raise argument_error(ArgumentError, ctx.op, name, "an int", repr(raw)) from None


def normalize_axis(op: str, axis: Any, ndim: int, arg: str = "axis") -> int:
    try:
        if isinstance(axis, bool):
            raise TypeError
        axis = operator.index(axis)
    except TypeError:
        raise argument_error(ArgumentError, op, arg, "an int", repr(axis)) from None
    if not -ndim <= axis < ndim:
        raise argument_error(ShapeError, op, arg, f"a value in [{-ndim}, {ndim}) for a {ndim}-d input", axis)
    return axis % ndim


def broadcast(op: str, shapes: Sequence[tuple[str, tuple[int, ...]]]) -> tuple[int, ...]:
    """NumPy broadcasting of named shapes; the error names the first argument that does not fit."""
    result: tuple[int, ...] = ()
    seen = []
    for name, shape in shapes:
        ndim = max(len(result), len(shape))
        padded_r, padded_s = (1,) * (ndim - len(result)) + result, (1,) * (ndim - len(shape)) + shape
        merged = []
        for r, s in zip(padded_r, padded_s):
            if r != s and 1 not in (r, s):
                with_ = " and ".join(f"'{n}'" for n in seen)
                raise argument_error(ShapeError, op, name, f"a shape broadcastable with {with_} {result}", shape)
            merged.append(s if r == 1 else r)
        result = tuple(merged)
        seen.append(name)
    return result


def numel(shape: Sequence[int]) -> int:
    return math.prod(shape)


def stored_as(y: np.ndarray, like: Any) -> np.ndarray:
    """float64 values `y` as an intermediate stored in `like`'s dtype would hold them (rounded to float16 or
    float32), for references of ops whose definition rounds on the way; float64 and non-float dtypes
    (a reference called with float64 copies, say) round nothing."""
    dtype = np.asarray(like).dtype
    if dtype.kind != "f" or dtype == np.float64:
        return y
    with np.errstate(over="ignore"):
        return np.asarray(y, np.float64).astype(dtype).astype(np.float64)
