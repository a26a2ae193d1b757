"""layer_norm and rms_norm over the trailing `normalized_shape` dims, with optional affine parameters."""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from ..context import DispatchContext
from ..dispatch import run
from ..errors import ArgumentError, ShapeError, argument_error
from ..schema import OpSchema
from .checks import finite_float, numel, require_dtype_like, require_float


def _normalized_shape(ctx: DispatchContext) -> tuple[int, ...]:
    raw = ctx.attrs["normalized_shape"]
    try:
        items = raw if isinstance(raw, tuple) else (raw,)
        if any(isinstance(n, bool | np.bool_) for n in items):
            raise TypeError  # True is an int to Python, never a size here
        dims = tuple(operator.index(n) for n in items)
    except TypeError:
        raise argument_error(
            ArgumentError, ctx.op, "normalized_shape", "an int or a tuple of ints", repr(raw)
        ) from None
    x = ctx.tensor("x").shape
    if not dims or x[len(x) - len(dims) :] != dims or len(dims) > len(x):
        raise argument_error(ShapeError, ctx.op, "x", f"trailing dimensions {dims} (normalized_shape)", f"shape {x}")
    if numel(dims) == 0:
        raise argument_error(ShapeError, ctx.op, "normalized_shape", "at least one element to normalize over", dims)
    return dims


MACHINE_EPSILON = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23, "float64": 2.0**-52}


def _eps(ctx: DispatchContext, default: float | None) -> float:
    eps = ctx.attrs["eps"]
    if eps is None:
        eps = default if default is not None else MACHINE_EPSILON.get(ctx.tensor("x").dtype)
    return finite_float(ctx.op, "eps", eps, "a finite number >= 0", minimum=0.0)


def _check_params(ctx: DispatchContext, names: tuple[str, ...], dims: tuple[int, ...]) -> None:
    for name in names:
        if ctx.has_tensor(name) and ctx.tensor(name).shape != dims:
            raise argument_error(ShapeError, ctx.op, name, f"shape {dims} (normalized_shape)", ctx.tensor(name).shape)


def _layer_norm_attrs(ctx: DispatchContext) -> dict[str, Any]:
    _infer_dtype(ctx)  # dtypes first: the attributes' defaults (eps) depend on a floating dtype
    dims = _normalized_shape(ctx)
    _check_params(ctx, ("weight", "bias"), dims)
    return {"normalized_shape": dims, "eps": _eps(ctx, 1e-5)}


def _rms_norm_attrs(ctx: DispatchContext) -> dict[str, Any]:
    _infer_dtype(ctx)  # dtypes first: eps=None means the (floating) dtype's machine epsilon
    dims = _normalized_shape(ctx)
    _check_params(ctx, ("weight",), dims)
    return {"normalized_shape": dims, "eps": _eps(ctx, None)}


def _infer_dtype(ctx: DispatchContext) -> str:
    dtype = require_float(ctx, "x")
    for name in ("weight", "bias"):
        if name in ctx.arg_names:
            require_dtype_like(ctx, name, "x")
    return dtype


def _axes(x: np.ndarray, normalized_shape: Any) -> tuple[int, ...]:
    count = 1 if isinstance(normalized_shape, int) else len(normalized_shape)
    return tuple(range(x.ndim - count, x.ndim))


def eps_as_added(x: Any, eps: float) -> float:
    """eps as the kernels add it: in the accumulation dtype, float32 below float64 (as PyTorch), where an
    eps under float32's smallest subnormal is 0."""
    return float(eps) if np.asarray(x).dtype.type is np.float64 else float(np.float32(eps))


def layer_norm_reference(
    x: Any, normalized_shape: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5
) -> np.ndarray:
    """float64 reference (biased variance, as PyTorch)."""
    eps = eps_as_added(x, eps)
    x = np.asarray(x, np.float64)
    axes = _axes(x, normalized_shape)
    centered = x - x.mean(axis=axes, keepdims=True)
    y = centered / np.sqrt((centered**2).mean(axis=axes, keepdims=True) + eps)
    if weight is not None:
        y = y * np.asarray(weight, np.float64)
    if bias is not None:
        y = y + np.asarray(bias, np.float64)
    return y


def rms_norm_reference(x: Any, normalized_shape: Any, weight: Any = None, eps: float | None = None) -> np.ndarray:
    """float64 reference; eps=None means the input dtype's machine epsilon, as PyTorch."""
    x_in = np.asarray(x)
    eps = eps_as_added(x_in, MACHINE_EPSILON[x_in.dtype.name] if eps is None else eps)
    x = x_in.astype(np.float64)
    y = x / np.sqrt((x**2).mean(axis=_axes(x, normalized_shape), keepdims=True) + eps)
    return y if weight is None else y * np.asarray(weight, np.float64)


LAYER_NORM = OpSchema(
    name="layer_norm",
    inputs=("x", "weight", "bias"),
    optional=frozenset({"weight", "bias"}),
    attrs=("normalized_shape", "eps"),
    defaults={"eps": 1e-5},
    normalize_attrs=_layer_norm_attrs,
    infer_dtype=_infer_dtype,
    infer_shape=lambda ctx: ctx.tensor("x").shape,
    reference=layer_norm_reference,
    inplace=True,
    flops=lambda ctx: 8 * numel(ctx.tensor("x").shape),
    doc="(x - mean) / sqrt(var + eps) * weight + bias over the trailing dims.",
)

RMS_NORM = OpSchema(
    name="rms_norm",
    inputs=("x", "weight"),
    optional=frozenset({"weight"}),
    attrs=("normalized_shape", "eps"),
    defaults={"eps": None},
    normalize_attrs=_rms_norm_attrs,
    infer_dtype=_infer_dtype,
    infer_shape=lambda ctx: ctx.tensor("x").shape,
    reference=rms_norm_reference,
    inplace=True,
    flops=lambda ctx: 5 * numel(ctx.tensor("x").shape),
    doc="x / sqrt(mean(x^2) + eps) * weight over the trailing dims.",
)


def layer_norm(
    x: Any, normalized_shape: int | tuple[int, ...], weight: Any = None, bias: Any = None, eps: float = 1e-5,
    *, out: Any = None,
) -> Any:  # fmt: skip
    """Layer normalization over the trailing `normalized_shape` dims (F.layer_norm's signature)."""
    if type(normalized_shape) is list:  # PyTorch users pass lists; a tuple keeps the fast path
        normalized_shape = tuple(normalized_shape)
    return run("layer_norm", (x, weight, bias), (normalized_shape, eps), out)


def rms_norm(
    x: Any,
    normalized_shape: int | tuple[int, ...],
    weight: Any = None,
    eps: float | None = None,
    *,
    out: Any = None,
) -> Any:
    """RMS normalization over the trailing dims (F.rms_norm's signature; eps=None: dtype's epsilon)."""
    if type(normalized_shape) is list:
        normalized_shape = tuple(normalized_shape)
    return run("rms_norm", (x, weight), (normalized_shape, eps), out)
