"""softmax(x, axis=-1): numerically stable; a row of only -inf gives NaN, as in PyTorch."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..context import DispatchContext
from ..dispatch import run
from ..schema import OpSchema
from .checks import normalize_axis, numel, require_float, require_ndim


def _normalize_attrs(ctx: DispatchContext) -> dict[str, Any]:
    require_ndim(ctx, "x", 1)
    return {"axis": normalize_axis(ctx.op, ctx.attrs["axis"], ctx.tensor("x").ndim)}


def reference(x: Any, axis: int = -1) -> np.ndarray:
    """float64 reference."""
    x = np.asarray(x, np.float64)
    if x.size == 0:
        return x.copy()
    with np.errstate(invalid="ignore"):
        e = np.exp(x - np.max(x, axis=axis, keepdims=True))
        return e / np.sum(e, axis=axis, keepdims=True)


SOFTMAX = OpSchema(
    name="softmax",
    inputs=("x",),
    attrs=("axis",),
    defaults={"axis": -1},
    normalize_attrs=_normalize_attrs,
    infer_dtype=lambda ctx: require_float(ctx, "x"),
    infer_shape=lambda ctx: ctx.tensor("x").shape,
    reference=reference,
    inplace=True,
    flops=lambda ctx: 5 * numel(ctx.tensor("x").shape),  # max, subtract, exp, sum, divide
    doc="Softmax along one axis.",
)


def softmax(x: Any, axis: int = -1, *, out: Any = None) -> Any:
    """exp(x - max) / sum(exp(x - max)) along `axis`. `out` may be x."""
    return run("softmax", (x,), (axis,), out)
