"""sum(x, axis=-1, keepdims=False): any axis or tuple of axes (negative too), None for all, 0-size safe."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..abi import FLOAT_DTYPES, INT_DTYPES
from ..context import DispatchContext
from ..dispatch import run
from ..errors import ArgumentError, DTypeError, argument_error
from ..schema import OpSchema
from .checks import normalize_axis, numel


def _normalize_attrs(ctx: DispatchContext) -> dict[str, Any]:
    _infer_dtype(ctx)  # a dtype error first: sum("abc") is about the dtype, not the axis
    ndim = ctx.tensor("x").ndim
    axis, keepdims = ctx.attrs["axis"], ctx.attrs["keepdims"]
    if axis is None:
        axes = tuple(range(ndim))
    else:
        raw = axis if isinstance(axis, tuple) else (axis,)
        axes = tuple(sorted(normalize_axis(ctx.op, a, ndim) for a in raw))
        if len(set(axes)) != len(axes):
            raise argument_error(ArgumentError, ctx.op, "axis", "distinct axes", axis)
    if not isinstance(keepdims, bool | np.bool_):
        raise argument_error(ArgumentError, ctx.op, "keepdims", "a bool", repr(keepdims))
    return {"axis": axes, "keepdims": bool(keepdims)}


def _infer_dtype(ctx: DispatchContext) -> str:
    dtype = ctx.tensor("x").dtype
    if dtype in FLOAT_DTYPES:
        return dtype
    if dtype == "uint64":
        return "uint64"  # int64 cannot hold it
    if dtype in INT_DTYPES or dtype == "bool":
        return "int64"  # like PyTorch: integer and bool sums accumulate and return int64
    raise argument_error(DTypeError, ctx.op, "x", "a floating, integer or bool dtype", dtype)


def _infer_shape(ctx: DispatchContext) -> tuple[int, ...]:
    axes, keep = ctx.attrs["axis"], ctx.attrs["keepdims"]
    shape = ctx.tensor("x").shape
    return tuple(1 if i in axes else n for i, n in enumerate(shape) if keep or i not in axes)


def reference(x: Any, axis: Any = -1, keepdims: bool = False) -> np.ndarray:
    """float64 (int64 for integers) reference."""
    x = np.asarray(x)
    acc = np.float64 if x.dtype.kind == "f" else (np.uint64 if x.dtype == np.uint64 else np.int64)
    return np.sum(x.astype(acc), axis=axis, keepdims=keepdims)


SUM = OpSchema(
    name="sum",
    inputs=("x",),
    attrs=("axis", "keepdims"),
    defaults={"axis": -1, "keepdims": False},
    normalize_attrs=_normalize_attrs,
    infer_dtype=_infer_dtype,
    infer_shape=_infer_shape,
    reference=reference,
    flops=lambda ctx: numel(ctx.tensor("x").shape),
    doc="Sum over one axis, a tuple of axes, or all (axis=None).",
)


def sum(x: Any, axis: int | tuple[int, ...] | None = -1, keepdims: bool = False, *, out: Any = None) -> Any:
    """Sum of x over `axis` (int, tuple or None for all axes); integer inputs give int64."""
    if type(axis) is list:
        axis = tuple(axis)
    return run("sum", (x,), (axis, keepdims), out)
