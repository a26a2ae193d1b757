"""CPU kernels for swiglu / geglu and their backward ops: NumPy in the compute dtype (float16 in float32),
rounding the activation to the input dtype where PyTorch's eager form stores it (ops/glu.py)."""

from __future__ import annotations

import math

import numpy as np

from ...abi import ArgPack
from ...registry import kernel
from .common import CPU_FLOAT_DTYPES, as_compute
from .fused_elementwise import erf

_SQRT1_2 = 1.0 / math.sqrt(2.0)
_TANH_C = math.sqrt(2.0 / math.pi)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _halves(gate: np.ndarray, up: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    if up is None:
        h = gate.shape[-1] // 2
        return gate[..., :h], gate[..., h:]
    return gate, up


def _act(g: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray | None]:
    """(act(g), sigmoid(g) for silu else None), in g's dtype, as PyTorch's kernels compute them."""
    one, half = g.dtype.type(1.0), g.dtype.type(0.5)
    with np.errstate(over="ignore"):
        if kind == "silu":
            e = np.exp(-g)
            return g / (one + e), one / (one + e)
        if kind == "tanh":
            inner = g.dtype.type(_TANH_C) * (g + g.dtype.type(0.044715) * g * g * g)
            return half * g * (one + np.tanh(inner)), None
        return half * g * (one + erf(g * g.dtype.type(_SQRT1_2))), None


def _derivative(g: np.ndarray, kind: str, sigmoid: np.ndarray | None) -> np.ndarray:
    """d act / d g in g's dtype (PyTorch's silu_backward / gelu_backward formulas)."""
    f = g.dtype.type
    if kind == "silu":
        return sigmoid * (f(1.0) + g * (f(1.0) - sigmoid))
    if kind == "tanh":
        t = np.tanh(f(_TANH_C) * (g + f(0.044715) * g * g * g))
        return f(0.5) * (f(1.0) + t) + f(0.5) * g * (f(1.0) - t * t) * f(_TANH_C) * (f(1.0) + f(3 * 0.044715) * g * g)
    with np.errstate(under="ignore"):
        pdf = np.exp(f(-0.5) * g * g) * f(_INV_SQRT_2PI)
    return f(0.5) * (f(1.0) + erf(g * f(_SQRT1_2))) + g * pdf


def _stored(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """a rounded to `dtype` (a stored intermediate), still in a's dtype."""
    if a.dtype == dtype:
        return a
    with np.errstate(over="ignore"):
        return a.astype(dtype).astype(a.dtype)


def _forward(args: ArgPack, kind: str) -> None:
    gate, up = _halves(*args.inputs[:2])
    g = as_compute(gate)
    a = _stored(_act(g, kind)[0], gate.dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        np.multiply(a, as_compute(up), out=args.out, casting="same_kind")


def _backward(args: ArgPack, kind: str) -> None:
    dy_in, gate_in, up_in = args.inputs
    gate, up = _halves(gate_in, up_in)
    dtype = gate.dtype
    g, u, dy = as_compute(gate), as_compute(up), as_compute(dy_in)
    with np.errstate(over="ignore", invalid="ignore"):
        a, sigmoid = _act(g, kind)
        du = dy * _stored(a, dtype)
        dg = _stored(dy * u, dtype) * _derivative(g, kind, sigmoid)
    out = args.out
    if up_in is None:  # [dgate | dup] along the last dim; `out` may be the packed input itself (all read above)
        h = dg.shape[-1]
        np.copyto(out[..., :h], dg, casting="same_kind")
        np.copyto(out[..., h:], du, casting="same_kind")
    else:
        np.copyto(out[0], dg, casting="same_kind")
        np.copyto(out[1], du, casting="same_kind")


_HINTS = dict(backend="cpu", dtypes=CPU_FLOAT_DTYPES, priority=10)


@kernel("swiglu", "numpy", **_HINTS)
def swiglu_numpy(args: ArgPack) -> None:
    """silu(gate) rounded to the input dtype, times up."""
    _forward(args, "silu")


@kernel("geglu", "numpy", **_HINTS)
def geglu_numpy(args: ArgPack) -> None:
    """gelu(gate) rounded to the input dtype, times up."""
    _forward(args, args.attrs["approximate"])


@kernel("swiglu_backward", "numpy", **_HINTS)
def swiglu_backward_numpy(args: ArgPack) -> None:
    """dup = dy * silu(gate); dgate = silu'(gate) * (dy * up)."""
    _backward(args, "silu")


@kernel("geglu_backward", "numpy", **_HINTS)
def geglu_backward_numpy(args: ArgPack) -> None:
    """dup = dy * gelu(gate); dgate = gelu'(gate) * (dy * up)."""
    _backward(args, args.attrs["approximate"])
