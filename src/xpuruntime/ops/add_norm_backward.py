"""add_rms_norm_backward and add_layer_norm_backward: the gradients of the add-norm ops (ops/add_norm.py).

`add_rms_norm_backward(dy, dh, h, weight, eps)` takes dy (the gradient of y), dh (the gradient that
reaches h = x + residual from the rest of the residual stream; None when h is not used further) and the
saved h, and returns `(dh_total, dweight)`: dh_total = dh + rms_norm's input gradient, which is the gradient
of both x and residual (cast it to each one's dtype); `add_layer_norm_backward` also returns dbias.

As in the norms' backward ops (ops/norm_backward.py), the single output packs the gradients as rows of an
(M + k, N) array in h's dtype: rows [0, M) are dh_total, row M is dweight and, for layer norm, row M + 1
dbias. Fusing the add of dh saves a read and a write of an (M, N) array per block.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..context import DispatchContext
from ..dispatch import run
from ..errors import ArgumentError, ShapeError, argument_error
from ..schema import OpSchema
from .checks import numel, require_dtype_like, require_float, require_ndim
from .norm import MACHINE_EPSILON, _eps, eps_as_added, rms_options
from .norm_backward import layer_norm_backward_reference, rms_norm_backward_reference, unpack


def _dtype(ctx: DispatchContext) -> str:
    dtype = require_float(ctx, "h")
    for name in ("dy", "dh", "weight"):
        require_dtype_like(ctx, name, "h")
    return dtype


def _shapes(ctx: DispatchContext) -> tuple[int, ...]:
    require_ndim(ctx, "h", 1)
    h = ctx.tensor("h").shape
    if h[-1] == 0:
        raise argument_error(ShapeError, ctx.op, "h", "a last dimension of at least one element", f"shape {h}")
    for name, want in (("dy", h), ("dh", h), ("weight", h[-1:])):
        if ctx.has_tensor(name) and ctx.tensor(name).shape != want:
            raise argument_error(ShapeError, ctx.op, name, f"shape {want}", ctx.tensor(name).shape)
    if not ctx.has_tensor("dy"):
        raise argument_error(ArgumentError, ctx.op, "dy", "an array", "None")
    return h[-1:]


def _rms_attrs(ctx: DispatchContext) -> dict[str, Any]:
    dtype = _dtype(ctx)  # with a default given, norm.py's _eps reads no dtype
    dims = _shapes(ctx)
    return {"normalized_shape": dims, "eps": _eps(ctx, MACHINE_EPSILON[dtype]), **rms_options(ctx)}


def _layer_attrs(ctx: DispatchContext) -> dict[str, Any]:
    _dtype(ctx)
    return {"normalized_shape": _shapes(ctx), "eps": _eps(ctx, 1e-5)}


def _packed_shape(extra_rows: int) -> Any:
    def infer(ctx: DispatchContext) -> tuple[int, ...]:
        h = ctx.tensor("h").shape
        return (numel(h) // h[-1] + extra_rows, h[-1])

    return infer


def _with_dh(packed: np.ndarray, dh: Any) -> np.ndarray:
    if dh is not None:
        dh = np.asarray(dh, np.float64)
        packed[: numel(dh.shape) // dh.shape[-1]] += dh.reshape(-1, dh.shape[-1])
    return packed


def add_rms_norm_backward_reference(
    dy: Any, dh: Any, h: Any, weight: Any = None, eps: float | None = None, offset: float = 0.0,
    casting: str = "torch",
) -> np.ndarray:  # fmt: skip
    """float64 reference, packed as [dh_total rows; dweight]."""
    h_in = np.asarray(h)
    eps = eps_as_added(h_in, MACHINE_EPSILON[h_in.dtype.name] if eps is None else eps)
    packed = rms_norm_backward_reference(dy, h_in, h_in.shape[-1:], weight, eps, offset, casting)
    return _with_dh(packed, dh)


def add_layer_norm_backward_reference(dy: Any, dh: Any, h: Any, weight: Any = None, eps: float = 1e-5) -> np.ndarray:
    """float64 reference, packed as [dh_total rows; dweight; dbias]."""
    h_in = np.asarray(h)
    return _with_dh(layer_norm_backward_reference(dy, h_in, h_in.shape[-1:], weight, eps), dh)


ADD_RMS_NORM_BACKWARD = OpSchema(
    name="add_rms_norm_backward",
    inputs=("dy", "dh", "h", "weight"),
    optional=frozenset({"dh", "weight"}),
    attrs=("eps", "offset", "casting"),
    defaults={"eps": None, "offset": 0.0, "casting": "torch"},
    normalize_attrs=_rms_attrs,
    infer_dtype=_dtype,
    infer_shape=_packed_shape(1),
    reference=add_rms_norm_backward_reference,
    flops=lambda ctx: 10 * numel(ctx.tensor("h").shape),
    doc="Gradients of add_rms_norm, packed as rows [dh_total; dweight] (dh_total = dh + the norm's dx).",
)

ADD_LAYER_NORM_BACKWARD = OpSchema(
    name="add_layer_norm_backward",
    inputs=("dy", "dh", "h", "weight"),
    optional=frozenset({"dh", "weight"}),
    attrs=("eps",),
    defaults={"eps": 1e-5},
    normalize_attrs=_layer_attrs,
    infer_dtype=_dtype,
    infer_shape=_packed_shape(2),
    reference=add_layer_norm_backward_reference,
    flops=lambda ctx: 13 * numel(ctx.tensor("h").shape),
    doc="Gradients of add_layer_norm, packed as rows [dh_total; dweight; dbias] (dh_total = dh + the norm's dx).",
)


def add_rms_norm_backward(
    dy: Any, dh: Any, h: Any, weight: Any = None, eps: float | None = None, *, offset: float = 0.0,
    casting: str = "torch", out: Any = None,
) -> tuple[Any, Any]:  # fmt: skip
    """(dh_total, dweight) of add_rms_norm for the upstream gradients dy (of y) and dh (of h, or None)."""
    packed = run("add_rms_norm_backward", (dy, dh, h, weight), (eps, offset, casting), out)
    return unpack(packed, tuple(np.shape(h)), np.shape(h)[-1:])


def add_layer_norm_backward(
    dy: Any, dh: Any, h: Any, weight: Any = None, eps: float = 1e-5, *, out: Any = None
) -> tuple[Any, Any, Any]:
    """(dh_total, dweight, dbias) of add_layer_norm for the upstream gradients dy (of y) and dh (or None)."""
    packed = run("add_layer_norm_backward", (dy, dh, h, weight), (eps,), out)
    return unpack(packed, tuple(np.shape(h)), np.shape(h)[-1:])
