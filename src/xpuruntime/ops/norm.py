"""layer_norm and rms_norm over the trailing `normalized_shape` dims, with optional affine parameters.

rms_norm computes in fp32 (float64 for float64 inputs) in one of two orders, the attribute `casting`:
- "torch" (default): y = x * rsqrt(mean(x^2) + eps) * (weight + offset), rounded once to x's dtype, as
  F.rms_norm (and Gemma's RMSNorm, with offset=1: `x_hat * (1 + weight)` in fp32) computes it;
- "llama": x_hat = x * rsqrt(mean(x^2) + eps) is rounded to x's dtype first, then multiplied by
  (weight + offset) and rounded again, as Hugging Face's LlamaRMSNorm / MistralRMSNorm / Qwen2RMSNorm
  compute `weight * hidden_states.to(input_dtype)`. The two differ in the last bit of fp16/bf16 outputs,
  which training parity with those modules needs.
eps sits inside the square root in both. `offset` applies to a given weight (None means a scale of 1).
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from ..context import DispatchContext
from ..dispatch import run
from ..errors import ArgumentError, ShapeError, argument_error
from ..schema import OpSchema
from .checks import finite_float, numel, require_dtype_like, require_float, stored_as


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


RMS_CASTINGS = ("torch", "llama")
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


def rms_options(ctx: DispatchContext) -> dict[str, Any]:
    """The rms_norm family's `offset` (a finite number added to the weight) and `casting` (RMS_CASTINGS)."""
    offset, casting = ctx.attrs["offset"], ctx.attrs["casting"]
    offset = finite_float(ctx.op, "offset", offset, "a finite number (1.0 for Gemma's 1 + weight)")
    if casting not in RMS_CASTINGS:
        raise argument_error(ArgumentError, ctx.op, "casting", f"one of {RMS_CASTINGS}", repr(casting))
    return {"offset": offset, "casting": casting}


def _rms_norm_attrs(ctx: DispatchContext) -> dict[str, Any]:
    _infer_dtype(ctx)  # dtypes first: eps=None means the (floating) dtype's machine epsilon
    dims = _normalized_shape(ctx)
    _check_params(ctx, ("weight",), dims)
    return {"normalized_shape": dims, "eps": _eps(ctx, None), **rms_options(ctx)}


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


def rounded_like(y: np.ndarray, like: Any, casting: str) -> np.ndarray:
    """y rounded to `like`'s dtype where `casting` is "llama" (the rounding is part of that order's
    definition; a float64 `like`, such as a reference's input, rounds nothing)."""
    return stored_as(y, like) if casting == "llama" else y


def rms_norm_reference(
    x: Any, normalized_shape: Any, weight: Any = None, eps: float | None = None, offset: float = 0.0,
    casting: str = "torch",
) -> np.ndarray:  # fmt: skip
    """float64 reference; eps=None means the input dtype's machine epsilon, as PyTorch."""
    x_in = np.asarray(x)
    eps = eps_as_added(x_in, MACHINE_EPSILON[x_in.dtype.name] if eps is None else eps)
    x = x_in.astype(np.float64)
    y = rounded_like(x / np.sqrt((x**2).mean(axis=_axes(x, normalized_shape), keepdims=True) + eps), x_in, casting)
    return y if weight is None else y * (np.asarray(weight, np.float64) + offset)


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
    attrs=("normalized_shape", "eps", "offset", "casting"),
    defaults={"eps": None, "offset": 0.0, "casting": "torch"},
    normalize_attrs=_rms_norm_attrs,
    infer_dtype=_infer_dtype,
    infer_shape=lambda ctx: ctx.tensor("x").shape,
    reference=rms_norm_reference,
    inplace=True,
    flops=lambda ctx: 5 * numel(ctx.tensor("x").shape),
    doc="x / sqrt(mean(x^2) + eps) * (weight + offset) over the trailing dims; casting 'torch' or 'llama'.",
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
    x: Any, normalized_shape: int | tuple[int, ...], weight: Any = None, eps: float | None = None, *,
    offset: float = 0.0, casting: str = "torch", out: Any = None,
) -> Any:  # fmt: skip
    """RMS normalization over the trailing dims (F.rms_norm's signature; eps=None: dtype's epsilon).
    `casting="llama"` rounds x_hat to x's dtype before the weight, as Hugging Face's LlamaRMSNorm;
    `offset=1.0` scales by (1 + weight), as Gemma's RMSNorm (module docstring)."""
    if type(normalized_shape) is list:
        normalized_shape = tuple(normalized_shape)
    return run("rms_norm", (x, weight), (normalized_shape, eps, offset, casting), out)
