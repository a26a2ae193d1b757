"""layer_norm_backward and rms_norm_backward: the norms' gradients (dx, dweight[, dbias]) in one call.

The op's single output packs the gradients as rows of an (M + k, N) array (N = prod(normalized_shape),
M = rows of x): rows [0, M) are dx, row M is dweight and, for layer norm, row M + 1 is dbias. One
allocation, one plan; the front ends return views of it. dweight/dbias are computed also when the
forward had no weight/bias (they are then the gradients of an implicit weight of ones / bias of zeros).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..context import DispatchContext
from ..dispatch import run
from ..errors import ShapeError, argument_error
from ..schema import OpSchema
from .checks import numel, require_dtype_like
from .norm import MACHINE_EPSILON, _eps, _infer_dtype, _normalized_shape, eps_as_added, rms_options, rounded_like


def _check_dy(ctx: DispatchContext) -> None:
    require_dtype_like(ctx, "dy", "x")
    if ctx.tensor("dy").shape != ctx.tensor("x").shape:
        raise argument_error(ShapeError, ctx.op, "dy", f"shape {ctx.tensor('x').shape} (same as 'x')",
                             ctx.tensor("dy").shape)  # fmt: skip


def _attrs(default_eps: float | None) -> Any:
    def normalize(ctx: DispatchContext) -> dict[str, Any]:
        _infer_dtype(ctx)  # dtypes first: eps=None means the (floating) dtype's machine epsilon
        dims = _normalized_shape(ctx)
        if ctx.has_tensor("weight") and ctx.tensor("weight").shape != dims:
            raise argument_error(ShapeError, ctx.op, "weight", f"shape {dims} (normalized_shape)",
                                 ctx.tensor("weight").shape)  # fmt: skip
        _check_dy(ctx)
        attrs = {"normalized_shape": dims, "eps": _eps(ctx, default_eps)}
        return {**attrs, **rms_options(ctx)} if "casting" in ctx.attrs else attrs

    return normalize


def _packed_shape(extra_rows: int) -> Any:
    def infer(ctx: DispatchContext) -> tuple[int, ...]:
        n = numel(ctx.attrs["normalized_shape"])
        return (numel(ctx.tensor("x").shape) // n + extra_rows, n)

    return infer


def _rows(x: np.ndarray, normalized_shape: Any) -> tuple[np.ndarray, tuple[int, ...]]:
    dims = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    n = math.prod(dims)
    return np.asarray(x, np.float64).reshape(-1, n), dims


def layer_norm_backward_reference(
    dy: Any, x: Any, normalized_shape: Any, weight: Any = None, eps: float = 1e-5
) -> np.ndarray:
    """float64 reference, packed as [dx rows; dweight; dbias]."""
    eps = eps_as_added(x, eps)
    x2, _ = _rows(x, normalized_shape)
    dy2, _ = _rows(dy, normalized_shape)
    w = 1.0 if weight is None else np.asarray(weight, np.float64).reshape(-1)
    centered = x2 - x2.mean(axis=1, keepdims=True)
    rstd = 1.0 / np.sqrt((centered**2).mean(axis=1, keepdims=True) + eps)
    xhat = centered * rstd
    wdy = dy2 * w
    dx = (wdy - xhat * (xhat * wdy).mean(axis=1, keepdims=True) - wdy.mean(axis=1, keepdims=True)) * rstd
    return np.concatenate([dx, (dy2 * xhat).sum(axis=0)[None], dy2.sum(axis=0)[None]])


def rms_norm_backward_reference(
    dy: Any, x: Any, normalized_shape: Any, weight: Any = None, eps: float | None = None, offset: float = 0.0,
    casting: str = "torch",
) -> np.ndarray:  # fmt: skip
    """float64 reference, packed as [dx rows; dweight]; eps=None: the dtype's machine epsilon. Under
    casting="llama" the gradients go through the forward's roundings as autograd takes them: dweight
    sums dy * round(x_hat), and the weight's gradient w * dy is rounded to x's dtype."""
    eps = eps_as_added(x, MACHINE_EPSILON[np.asarray(x).dtype.name] if eps is None else eps)
    x2, _ = _rows(x, normalized_shape)
    dy2, _ = _rows(dy, normalized_shape)
    w = 1.0 if weight is None else np.asarray(weight, np.float64).reshape(-1) + offset
    rstd = 1.0 / np.sqrt((x2**2).mean(axis=1, keepdims=True) + eps)
    xhat = x2 * rstd
    wdy = rounded_like(dy2 * w, x, casting)
    dx = (wdy - xhat * (xhat * wdy).mean(axis=1, keepdims=True)) * rstd
    return np.concatenate([dx, (dy2 * rounded_like(xhat, x, casting)).sum(axis=0)[None]])


LAYER_NORM_BACKWARD = OpSchema(
    name="layer_norm_backward",
    inputs=("dy", "x", "weight"),
    optional=frozenset({"weight"}),
    attrs=("normalized_shape", "eps"),
    defaults={"eps": 1e-5},
    normalize_attrs=_attrs(1e-5),
    infer_dtype=_infer_dtype,
    infer_shape=_packed_shape(2),
    reference=layer_norm_backward_reference,
    flops=lambda ctx: 12 * numel(ctx.tensor("x").shape),
    doc="Gradients of layer_norm, packed as rows [dx; dweight; dbias].",
)

RMS_NORM_BACKWARD = OpSchema(
    name="rms_norm_backward",
    inputs=("dy", "x", "weight"),
    optional=frozenset({"weight"}),
    attrs=("normalized_shape", "eps", "offset", "casting"),
    defaults={"eps": None, "offset": 0.0, "casting": "torch"},
    normalize_attrs=_attrs(None),
    infer_dtype=_infer_dtype,
    infer_shape=_packed_shape(1),
    reference=rms_norm_backward_reference,
    flops=lambda ctx: 9 * numel(ctx.tensor("x").shape),
    doc="Gradients of rms_norm, packed as rows [dx; dweight].",
)


def unpack(packed: Any, x_shape: tuple[int, ...], normalized_shape: Any) -> tuple[Any, ...]:
    """Views of a packed gradient array: (dx shaped like x, dweight, [dbias]) shaped normalized_shape."""
    dims = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    m = math.prod(x_shape) // math.prod(dims)
    grads = tuple(packed[i].reshape(dims) for i in range(m, packed.shape[0]))
    return (packed[:m].reshape(tuple(x_shape)), *grads)


def layer_norm_backward(
    dy: Any, x: Any, normalized_shape: int | tuple[int, ...], weight: Any = None, eps: float = 1e-5,
    *, out: Any = None,
) -> tuple[Any, Any, Any]:  # fmt: skip
    """(dx, dweight, dbias) of layer_norm(x, normalized_shape, weight, bias, eps) for upstream gradient dy."""
    if type(normalized_shape) is list:
        normalized_shape = tuple(normalized_shape)
    packed = run("layer_norm_backward", (dy, x, weight), (normalized_shape, eps), out)
    return unpack(packed, tuple(np.shape(x)), normalized_shape)


def rms_norm_backward(
    dy: Any, x: Any, normalized_shape: int | tuple[int, ...], weight: Any = None, eps: float | None = None,
    *, offset: float = 0.0, casting: str = "torch", out: Any = None,
) -> tuple[Any, Any]:  # fmt: skip
    """(dx, dweight) of rms_norm(x, normalized_shape, weight, eps, offset=, casting=) for upstream gradient dy."""
    if type(normalized_shape) is list:
        normalized_shape = tuple(normalized_shape)
    packed = run("rms_norm_backward", (dy, x, weight), (normalized_shape, eps, offset, casting), out)
    return unpack(packed, tuple(np.shape(x)), normalized_shape)
