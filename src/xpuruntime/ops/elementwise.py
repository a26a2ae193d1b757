"""sin_affine: y = sin(a*x + b), NumPy broadcasting, any strides. The elementwise vertical slice."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..context import DispatchContext
from ..dispatch import run
from ..schema import OpSchema
from .checks import broadcast, numel, require_dtype_like, require_float


def _infer_dtype(ctx: DispatchContext) -> str:
    dtype = require_float(ctx, "x")
    require_dtype_like(ctx, "a", "x")
    require_dtype_like(ctx, "b", "x")
    return dtype


def _infer_shape(ctx: DispatchContext) -> tuple[int, ...]:
    return broadcast(ctx.op, [(n, ctx.tensor(n).shape) for n in ("x", "a", "b") if ctx.has_tensor(n)])


def reference(x: Any, a: Any = 1.0, b: Any = 0.0) -> np.ndarray:
    """float64 reference."""
    f64 = np.float64
    return np.sin(np.asarray(a, f64) * np.asarray(x, f64) + np.asarray(b, f64))


SIN_AFFINE = OpSchema(
    name="sin_affine",
    inputs=("x", "a", "b"),
    scalars=frozenset({"a", "b"}),
    defaults={"a": 1.0, "b": 0.0},
    infer_dtype=_infer_dtype,
    infer_shape=_infer_shape,
    reference=reference,
    inplace=True,
    flops=lambda ctx: 3 * numel(ctx.out_shape),  # multiply, add, sine
    doc="y = sin(a*x + b) with broadcasting; a and b may be Python numbers.",
)


def sin_affine(x: Any, a: Any = 1.0, b: Any = 0.0, *, out: Any = None) -> Any:
    """y = sin(a*x + b), broadcasting x, a and b (a, b may be Python numbers). `out` may be x."""
    if type(a) is not float and isinstance(a, np.generic):  # NumPy scalars act as Python numbers,
        a = a.item()  # here rather than on the dispatcher's slow path, so they keep the fast path
    if type(b) is not float and isinstance(b, np.generic):
        b = b.item()
    return run("sin_affine", (x, a, b), (), out)
