"""add_rms_norm and add_layer_norm: a transformer block's residual add and the norm after it, in one op.

`add_rms_norm(x, residual, weight, eps)` returns `(y, h)` with h = x + residual (the new residual stream)
and y = rms_norm(h) over the last dimension; `add_layer_norm(x, residual, weight, bias, eps)` likewise
with layer_norm. h is what `x + residual` stores: in the dtype x and residual promote to (bf16 + fp32 is
fp32, as under autocast, where the residual stream stays fp32), rounded once; y is normalized from that h,
in the same dtype. weight and bias have h's dtype. add_rms_norm takes rms_norm's `offset` and `casting`
(ops/norm.py: casting="llama" for Hugging Face's Llama / Mistral / Qwen2 RMSNorm, offset=1.0 for Gemma's).

The kernel ABI has one output per op, so the op's output is y and h is written into the input buffer
`residual_out` (contiguous, x's shape, h's dtype), which the front end allocates (as attention_forward's
lse). In-place use: `out` may be x or residual itself, and so may `residual_out` (each element is read
before it is written), but not both the same array.

Backward: add_rms_norm_backward / add_layer_norm_backward (ops/add_norm_backward.py) take the saved h.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from ..arrays import as_array, check_output_aliasing, is_torch_tensor, overlaps
from ..context import DispatchContext
from ..dispatch import run
from ..errors import DTypeError, LayoutError, ShapeError, argument_error
from ..schema import OpSchema
from .attention_forward import empty_like_backend
from .checks import numel, require_float, require_ndim, stored_as
from .norm import MACHINE_EPSILON, _eps, eps_as_added, layer_norm_reference, rms_norm_reference, rms_options

_ORDER = ("float16", "bfloat16", "float32", "float64")


def promoted(a: str, b: str) -> str:
    """The floating dtype `a + b` has, as PyTorch promotes: float16 with bfloat16 is float32."""
    if a == b:
        return a
    if {a, b} == {"float16", "bfloat16"}:
        return "float32"
    return max(a, b, key=_ORDER.index)


def sum_dtype(ctx: DispatchContext) -> str:
    """h's dtype, with every dtype rule of the add forms checked (naming the argument)."""
    dtype = promoted(require_float(ctx, "x"), require_float(ctx, "residual"))
    for name in ("weight", "bias", "residual_out"):
        if name in ctx.arg_names and ctx.has_tensor(name) and ctx.tensor(name).dtype != dtype:
            expected = f"dtype {dtype} (that of x + residual)"
            raise argument_error(DTypeError, ctx.op, name, expected, ctx.tensor(name).dtype)
    return dtype


def check_residual_shapes(ctx: DispatchContext) -> tuple[int, ...]:
    """x and residual alike, at least 1-d with a non-empty last dimension; weight/bias (N,); returns (N,)."""
    require_ndim(ctx, "x", 1)
    x = ctx.tensor("x").shape
    if ctx.tensor("residual").shape != x:
        raise argument_error(ShapeError, ctx.op, "residual", f"shape {x} (that of x)", ctx.tensor("residual").shape)
    if x[-1] == 0:
        raise argument_error(ShapeError, ctx.op, "x", "a last dimension of at least one element", f"shape {x}")
    for name in ("weight", "bias"):
        if name in ctx.arg_names and ctx.has_tensor(name) and ctx.tensor(name).shape != x[-1:]:
            raise argument_error(ShapeError, ctx.op, name, f"shape {x[-1:]} (x's last dimension)",
                                 ctx.tensor(name).shape)  # fmt: skip
    return x[-1:]


def _check_buffer(ctx: DispatchContext) -> None:
    buffer, x = ctx.tensor("residual_out"), ctx.tensor("x").shape
    if buffer.shape != x:
        raise argument_error(ShapeError, ctx.op, "residual_out", f"a buffer of shape {x}", f"shape {buffer.shape}")
    if buffer.layout != "contiguous" and numel(x):
        raise argument_error(ShapeError, ctx.op, "residual_out", "a contiguous buffer", f"strides {buffer.strides}")


def _rms_attrs(ctx: DispatchContext) -> dict[str, Any]:
    dtype = sum_dtype(ctx)  # dtypes first: eps=None means h's machine epsilon
    dims = check_residual_shapes(ctx)
    _check_buffer(ctx)
    return {"normalized_shape": dims, "eps": _eps(ctx, MACHINE_EPSILON[dtype]), **rms_options(ctx)}


def _layer_attrs(ctx: DispatchContext) -> dict[str, Any]:
    sum_dtype(ctx)
    dims = check_residual_shapes(ctx)
    _check_buffer(ctx)
    return {"normalized_shape": dims, "eps": _eps(ctx, 1e-5)}


def sum_reference(x: Any, residual: Any) -> np.ndarray:
    """h = x + residual, rounded to the promoted dtype where NumPy has it (float64 values)."""
    x, residual = np.asarray(x), np.asarray(residual)
    h = x.astype(np.float64) + residual.astype(np.float64)
    return stored_as(h, np.empty(0, np.result_type(x.dtype, residual.dtype)))


def _sum_into(x: Any, residual: Any, residual_out: Any) -> np.ndarray:
    """sum_reference(x, residual), also stored in `residual_out` where that is a NumPy array (the ONNX
    session's reference steps read h from it); the reference never reads it."""
    h = sum_reference(x, residual)
    if isinstance(residual_out, np.ndarray):
        residual_out[...] = h
    return h


def _eps_of(x: Any, residual: Any, eps: float | None) -> float:
    """eps as rms_norm_reference would add it for h's dtype (eps=None: that dtype's machine epsilon)."""
    dtype = np.result_type(np.asarray(x).dtype, np.asarray(residual).dtype)
    return eps_as_added(np.empty(0, dtype), MACHINE_EPSILON[dtype.name] if eps is None else eps)


def add_rms_norm_reference(
    x: Any, residual: Any, weight: Any = None, residual_out: Any = None, eps: float | None = None,
    offset: float = 0.0, casting: str = "torch",
) -> np.ndarray:  # fmt: skip
    """float64 reference of y (h = sum_reference(x, residual), written into a NumPy residual_out if given)."""
    h = _sum_into(x, residual, residual_out)
    dtype = np.result_type(np.asarray(x).dtype, np.asarray(residual).dtype)
    like = h.astype(dtype) if casting == "llama" else h  # llama rounds x_hat to h's dtype
    with np.errstate(over="ignore"):
        return rms_norm_reference(like, h.shape[-1:], weight, _eps_of(x, residual, eps), offset, casting)


def add_layer_norm_reference(
    x: Any, residual: Any, weight: Any = None, bias: Any = None, residual_out: Any = None, eps: float = 1e-5
) -> np.ndarray:
    """float64 reference of y (h = sum_reference(x, residual), written into a NumPy residual_out if given)."""
    h = _sum_into(x, residual, residual_out)
    return layer_norm_reference(h, h.shape[-1:], weight, bias, _eps_of(x, residual, eps))


ADD_RMS_NORM = OpSchema(
    name="add_rms_norm",
    inputs=("x", "residual", "weight", "residual_out"),
    optional=frozenset({"weight"}),
    buffers=frozenset({"residual_out"}),
    attrs=("eps", "offset", "casting"),
    defaults={"eps": None, "offset": 0.0, "casting": "torch"},
    normalize_attrs=_rms_attrs,
    infer_dtype=sum_dtype,
    infer_shape=lambda ctx: ctx.tensor("x").shape,
    reference=add_rms_norm_reference,
    inplace=True,
    flops=lambda ctx: 6 * numel(ctx.tensor("x").shape),
    doc="h = x + residual (into residual_out), y = rms_norm(h) over the last dim.",
)

ADD_LAYER_NORM = OpSchema(
    name="add_layer_norm",
    inputs=("x", "residual", "weight", "bias", "residual_out"),
    optional=frozenset({"weight", "bias"}),
    buffers=frozenset({"residual_out"}),
    attrs=("eps",),
    defaults={"eps": 1e-5},
    normalize_attrs=_layer_attrs,
    infer_dtype=sum_dtype,
    infer_shape=lambda ctx: ctx.tensor("x").shape,
    reference=add_layer_norm_reference,
    inplace=True,
    flops=lambda ctx: 9 * numel(ctx.tensor("x").shape),
    doc="h = x + residual (into residual_out), y = layer_norm(h) over the last dim.",
)


def _dtype_name(x: Any) -> str:
    return str(getattr(x, "dtype", "")).removeprefix("torch.")


def residual_buffer(op: str, x: Any, residual: Any, residual_out: Any, out: Any) -> Any:
    """The caller's residual_out (checked: no partial overlap with x or residual, none with `out`), or a
    fresh buffer of h's dtype beside x."""
    if residual_out is None:
        with contextlib.suppress(TypeError, ValueError):  # the dispatcher names the bad argument
            x, residual = as_array(x), as_array(residual)
        dtypes = (_dtype_name(x), _dtype_name(residual))
        dtype = promoted(*dtypes) if all(d in _ORDER for d in dtypes) else "float32"
        return empty_like_backend(x, tuple(getattr(x, "shape", ())), dtype, f"{op}: residual_out")
    if not _is_array(residual_out):
        return residual_out  # the dispatcher names what is wrong with it
    if _is_array(out) and overlaps(out, residual_out):
        raise LayoutError(f"{op}: argument 'residual_out' overlaps 'out'; expected two separate arrays")
    named = [(n, t) for n, t in (("x", x), ("residual", residual)) if _is_array(t)]
    check_output_aliasing(op, tuple(n for n, _ in named), tuple(t for _, t in named), residual_out, True,
                          "residual_out")  # fmt: skip
    return residual_out


def _is_array(x: Any) -> bool:
    return isinstance(x, np.ndarray) or is_torch_tensor(x)


def add_rms_norm(
    x: Any, residual: Any, weight: Any = None, eps: float | None = None, *, offset: float = 0.0,
    casting: str = "torch", out: Any = None, residual_out: Any = None,
) -> tuple[Any, Any]:  # fmt: skip
    """(rms_norm(h), h) with h = x + residual, over the last dimension; see the module docstring."""
    h = residual_buffer("add_rms_norm", x, residual, residual_out, out)
    y = run("add_rms_norm", (x, residual, weight, h), (eps, offset, casting), out)
    return y, h


def add_layer_norm(
    x: Any, residual: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5, *, out: Any = None,
    residual_out: Any = None,
) -> tuple[Any, Any]:  # fmt: skip
    """(layer_norm(h), h) with h = x + residual, over the last dimension; see the module docstring."""
    h = residual_buffer("add_layer_norm", x, residual, residual_out, out)
    y = run("add_layer_norm", (x, residual, weight, bias, h), (eps,), out)
    return y, h
