"""linear(x, weight, bias=None, activation=None): y = act(x @ weight.T + bias), PyTorch's layout.

`x` is (..., K) with any leading dims, `weight` (N, K), `bias` (N,); the result is (..., N).
`activation` is None, "relu" or "gelu"; "gelu" is the tanh approximation (what cuBLASLt's GELU
epilogue computes, PyTorch's `F.gelu(approximate="tanh")`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..context import DispatchContext
from ..dispatch import run
from ..errors import ArgumentError, ShapeError, argument_error
from ..schema import OpSchema
from .checks import require_dtype_like, require_float, require_ndim

ACTIVATIONS = (None, "relu", "gelu")
_GELU_C = math.sqrt(2.0 / math.pi)
_GELU_A = 0.044715


def check_activation(ctx: DispatchContext) -> str | None:
    """The activation attribute, checked: None, "relu" or "gelu"."""
    activation = ctx.attrs["activation"]
    if activation not in ACTIVATIONS:
        raise argument_error(ArgumentError, ctx.op, "activation", "None, 'relu' or 'gelu'", repr(activation))
    return activation


def gelu_tanh(z: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation, in the input's precision."""
    return 0.5 * z * (1.0 + np.tanh(_GELU_C * (z + _GELU_A * z**3)))


def gelu_tanh_grad(z: np.ndarray) -> np.ndarray:
    """d gelu_tanh(z) / dz."""
    t = np.tanh(_GELU_C * (z + _GELU_A * z**3))
    return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * _GELU_C * (1.0 + 3.0 * _GELU_A * z * z)


def activate(z: np.ndarray, activation: str | None) -> np.ndarray:
    if activation == "relu":
        return np.maximum(z, 0)
    if activation == "gelu":
        return gelu_tanh(z)
    return z


def activation_grad(z: np.ndarray, activation: str | None) -> np.ndarray | float:
    """act'(z); 1 for no activation (relu' at 0 is 0, as PyTorch's threshold_backward)."""
    if activation == "relu":
        return (z > 0).astype(z.dtype)
    if activation == "gelu":
        return gelu_tanh_grad(z)
    return 1.0


def weight_shape(ctx: DispatchContext) -> tuple[int, int]:
    """The weight's (out_features, in_features), or a ShapeError when it is not 2-d."""
    w = ctx.tensor("weight").shape
    if len(w) != 2:
        raise argument_error(ShapeError, ctx.op, "weight", "a 2-d (out_features, in_features) array", f"shape {w}")
    return w


def gemm_dims(ctx: DispatchContext) -> dict[str, Any]:
    """The GEMM of x @ weight.T + bias, checked: batch (x's leading dims), M (their product), N, K."""
    require_ndim(ctx, "x", 1)
    x, w = ctx.tensor("x").shape, weight_shape(ctx)
    if x[-1] != w[1]:
        raise argument_error(ShapeError, ctx.op, "x", f"last dimension {w[1]} (weight's in_features)", f"shape {x}")
    if ctx.has_tensor("bias") and ctx.tensor("bias").shape != (w[0],):
        raise argument_error(ShapeError, ctx.op, "bias", f"shape ({w[0]},)", ctx.tensor("bias").shape)
    return {"batch": x[:-1], "m": math.prod(x[:-1]), "n": w[0], "k": w[1]}


def _normalize_attrs(ctx: DispatchContext) -> dict[str, Any]:
    return {"activation": check_activation(ctx), **gemm_dims(ctx)}


def _infer_dtype(ctx: DispatchContext) -> str:
    dtype = require_float(ctx, "x")
    require_dtype_like(ctx, "weight", "x")
    require_dtype_like(ctx, "bias", "x")
    return dtype


def flops(ctx: DispatchContext) -> int:
    at = ctx.attrs
    return 2 * at["m"] * at["n"] * at["k"]


def reference(x: Any, weight: Any, bias: Any = None, activation: str | None = None) -> np.ndarray:
    """float64 reference."""
    z = np.asarray(x, np.float64) @ np.asarray(weight, np.float64).T
    if bias is not None:
        z = z + np.asarray(bias, np.float64)
    return activate(z, activation)


LINEAR = OpSchema(
    name="linear",
    inputs=("x", "weight", "bias"),
    optional=frozenset({"bias"}),
    attrs=("activation",),
    defaults={"activation": None},
    normalize_attrs=_normalize_attrs,
    infer_dtype=_infer_dtype,
    infer_shape=lambda ctx: (*ctx.attrs["batch"], ctx.attrs["n"]),
    reference=reference,
    flops=flops,
    doc="act(x @ weight.T + bias) (F.linear's layout); act is None, 'relu' or 'gelu' (tanh).",
)


def linear(x: Any, weight: Any, bias: Any = None, activation: str | None = None, *, out: Any = None) -> Any:
    """y = act(x @ weight.T + bias) with F.linear's layout; "gelu" is the tanh approximation."""
    return run("linear", (x, weight, bias), (activation,), out)
