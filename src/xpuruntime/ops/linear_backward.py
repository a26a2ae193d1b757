"""Backward ops of `linear`, shaped after cuBLASLt's backward epilogues (DGELU, BGRAD).

- `linear_grad_input(dy, weight, preact=None, activation=None)`: dx = (dy @ weight) * act'(preact).
  `preact` is the pre-activation that produced this layer's input x = act(preact) (the previous
  layer's, as in an MLP), so the activation's derivative fuses into the GEMM (cuBLASLt's DGELU).
- `linear_grad_weight(dy, x, bias=False)`: dW = dy^T @ x over all leading dims, shape (N, K). With
  bias=True both gradients come from one GEMM (cuBLASLt's BGRAD epilogue), packed in one 1-D buffer
  of N*K + N elements: dW (row-major) then db, the sum of dy over the leading dims; both parts are
  contiguous, and `split_weight_grad(g, n, k)` returns them as views.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np

from ..abi import TensorSpec
from ..arrays import SCALAR_TYPES, as_array
from ..context import DispatchContext
from ..dispatch import run
from ..errors import ArgumentError, ShapeError, argument_error, clip
from ..schema import OpSchema
from .checks import require_dtype_like, require_float, require_ndim
from .linear import activation_grad, check_activation, weight_shape


def _grad_input_attrs(ctx: DispatchContext) -> dict[str, Any]:
    require_ndim(ctx, "dy", 1)
    dy, w = ctx.tensor("dy").shape, weight_shape(ctx)
    if dy[-1] != w[0]:
        raise argument_error(ShapeError, ctx.op, "dy", f"last dimension {w[0]} (weight's out_features)", f"shape {dy}")
    activation = check_activation(ctx)
    out_shape = (*dy[:-1], w[1])
    if activation is not None and not ctx.has_tensor("preact"):
        raise argument_error(ArgumentError, ctx.op, "preact", f"an array (activation={activation!r})", "None")
    if ctx.has_tensor("preact") and ctx.tensor("preact").shape != out_shape:
        raise argument_error(
            ShapeError, ctx.op, "preact", f"shape {out_shape} (that of dx)", ctx.tensor("preact").shape
        )
    return {"activation": activation, "batch": dy[:-1], "m": math.prod(dy[:-1]), "n": w[0], "k": w[1]}


def _grad_weight_attrs(ctx: DispatchContext) -> dict[str, Any]:
    require_ndim(ctx, "dy", 1)
    require_ndim(ctx, "x", 1)
    dy, x = ctx.tensor("dy").shape, ctx.tensor("x").shape
    if dy[:-1] != x[:-1]:
        raise argument_error(ShapeError, ctx.op, "x", f"leading dimensions {dy[:-1]} (those of dy)", f"shape {x}")
    bias = ctx.attrs["bias"]
    if not isinstance(bias, bool):
        raise argument_error(ArgumentError, ctx.op, "bias", "a bool", repr(bias))
    return {"bias": bias, "batch": dy[:-1], "m": math.prod(dy[:-1]), "n": dy[-1], "k": x[-1]}


def _grad_weight_shape(ctx: DispatchContext) -> tuple[int, ...]:
    n, k = ctx.attrs["n"], ctx.attrs["k"]
    return (n * k + n,) if ctx.attrs["bias"] else (n, k)


def _dtype_of(first: str, second: str, third: str | None = None):
    def infer(ctx: DispatchContext) -> str:
        dtype = require_float(ctx, first)
        for name in (second, third):
            if name is not None:
                require_dtype_like(ctx, name, first)
        return dtype

    return infer


def _gemm_flops(ctx: DispatchContext) -> int:
    at = ctx.attrs
    return 2 * at["m"] * at["n"] * at["k"]


def grad_input_reference(dy: Any, weight: Any, preact: Any = None, activation: str | None = None) -> np.ndarray:
    """float64 reference."""
    dx = np.asarray(dy, np.float64) @ np.asarray(weight, np.float64)
    if activation is None:
        return dx
    return dx * activation_grad(np.asarray(preact, np.float64), activation)


def grad_weight_reference(dy: Any, x: Any, bias: bool = False) -> np.ndarray:
    """float64 reference."""
    dy, x = np.asarray(dy, np.float64), np.asarray(x, np.float64)
    m = math.prod(dy.shape[:-1])
    dy2, x2 = dy.reshape(m, dy.shape[-1]), x.reshape(m, x.shape[-1])
    dw = dy2.T @ x2
    return np.concatenate([dw.ravel(), dy2.sum(axis=0)]) if bias else dw


LINEAR_GRAD_INPUT = OpSchema(
    name="linear_grad_input",
    inputs=("dy", "weight", "preact"),
    optional=frozenset({"preact"}),
    attrs=("activation",),
    defaults={"activation": None},
    normalize_attrs=_grad_input_attrs,
    infer_dtype=_dtype_of("dy", "weight", "preact"),
    infer_shape=lambda ctx: (*ctx.attrs["batch"], ctx.attrs["k"]),
    reference=grad_input_reference,
    flops=_gemm_flops,
    doc="(dy @ weight) * act'(preact): the input gradient of linear, with the producer's activation.",
)

LINEAR_GRAD_WEIGHT = OpSchema(
    name="linear_grad_weight",
    inputs=("dy", "x"),
    attrs=("bias",),
    defaults={"bias": False},
    normalize_attrs=_grad_weight_attrs,
    infer_dtype=_dtype_of("dy", "x"),
    infer_shape=_grad_weight_shape,
    reference=grad_weight_reference,
    flops=_gemm_flops,
    doc="dy^T @ x over the leading dims (N, K); bias=True: dW and db packed in one (N*K + N,) buffer.",
)


def linear_grad_input(
    dy: Any, weight: Any, preact: Any = None, activation: str | None = None, *, out: Any = None
) -> Any:
    """dx = (dy @ weight) * act'(preact), where this layer's input was act(preact)."""
    return run("linear_grad_input", (dy, weight, preact), (activation,), out)


def linear_grad_weight(dy: Any, x: Any, bias: bool = False, *, out: Any = None) -> Any:
    """dW = dy^T @ x, (N, K); with bias=True dW and db packed as (N*K + N,) (see split_weight_grad)."""
    return run("linear_grad_weight", (dy, x), (bias,), out)


SPLIT = "split_weight_grad"


def _size_argument(name: str, value: Any) -> int:
    """A dimension size: a non-negative int (NumPy integers too; no bools, floats or arrays of several)."""
    try:
        if isinstance(value, bool):
            raise TypeError
        size = operator.index(value)
    except (TypeError, ValueError):
        raise argument_error(ArgumentError, SPLIT, name, "a non-negative int", clip(value)) from None
    if size < 0:
        raise argument_error(ArgumentError, SPLIT, name, "a non-negative int", size)
    return size


def _packed_argument(grad: Any, n: int, k: int) -> Any:
    """`grad` as an array (array-likes converted as every op converts them), 1-d with n*k + n elements."""
    if grad is None or type(grad) in SCALAR_TYPES or isinstance(grad, TensorSpec):
        got = "None" if grad is None else type(grad).__name__
        raise argument_error(ArgumentError, SPLIT, "grad", "an array (linear_grad_weight's result, bias=True)", got)
    try:
        grad = as_array(grad)
    except (TypeError, ValueError) as exc:
        raise argument_error(ArgumentError, SPLIT, "grad", "an array", f"{type(grad).__name__}: {exc}") from None
    expected = f"a 1-d array of n*k + n = {n * k + n} elements (dW then db, as linear_grad_weight packs them)"
    if grad.ndim != 1:
        raise argument_error(ShapeError, SPLIT, "grad", expected, f"{grad.ndim}-d shape {tuple(grad.shape)}")
    if grad.shape[0] != n * k + n:
        hint = " (dW alone: linear_grad_weight's result with bias=False?)" if grad.shape[0] == n * k else ""
        raise argument_error(ShapeError, SPLIT, "grad", expected, f"{grad.shape[0]} elements{hint}")
    return grad


def split_weight_grad(grad: Any, n: int, k: int) -> tuple[Any, Any]:
    """(dW (n, k), db (n,)) views of linear_grad_weight(..., bias=True)'s packed result (any dtype; a
    NumPy array or a tensor, whose views come back as the same type)."""
    n, k = _size_argument("n", n), _size_argument("k", k)
    grad = _packed_argument(grad, n, k)
    return grad[: n * k].reshape(n, k), grad[n * k :]
