"""swiglu_backward and geglu_backward: the gradients of the gated activations (ops/glu.py).

`swiglu_backward(dy, gate, up)` returns `(dgate, dup)`; with the packed form (`up=None`) it returns the one
gradient of the packed [gate | up] input. They follow autograd through PyTorch's eager form: dup = dy * a
with a = act(gate) as stored, and dgate = act'(gate) * (dy * up rounded to the input dtype).

The kernel ABI has one output per op: for two inputs it packs (2, *gate.shape) = [dgate; dup] (each
half contiguous), for the packed input it has that input's shape ([dgate | dup] along the last dimension,
which `out=` may be the packed input itself: each element is read before it is written).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..context import DispatchContext
from ..dispatch import run
from ..errors import ShapeError, argument_error
from ..schema import OpSchema
from .checks import stored_as
from .fused_elementwise import UNARY
from .glu import activation, glu_attrs, glu_dtype, halves


def _attrs(ctx: DispatchContext) -> dict[str, Any]:
    attrs = glu_attrs(ctx)
    hidden_shape = (*ctx.tensor("gate").shape[:-1], attrs["hidden"])
    if ctx.tensor("dy").shape != hidden_shape:
        raise argument_error(ShapeError, ctx.op, "dy", f"shape {hidden_shape} (the activation's output)",
                             ctx.tensor("dy").shape)  # fmt: skip
    return attrs


def _shape(ctx: DispatchContext) -> tuple[int, ...]:
    gate = ctx.tensor("gate").shape
    return gate if ctx.attrs["packed"] else (2, *gate)


def derivative(g: np.ndarray, kind: str) -> np.ndarray:
    """float64 d act / d gate: silu, or gelu with F.gelu's `approximate`."""
    with np.errstate(over="ignore", invalid="ignore"):
        if kind == "silu":
            s = 1.0 / (1.0 + np.exp(-g))
            return s * (1.0 + g * (1.0 - s))
        if kind == "tanh":
            k = np.sqrt(2.0 / np.pi)
            t = np.tanh(k * (g + 0.044715 * g**3))
            return 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * k * (1.0 + 3 * 0.044715 * g * g)
        cdf = 0.5 * (1.0 + UNARY["erf"](g / np.sqrt(2.0)))
        return cdf + g * np.exp(-0.5 * g * g) / np.sqrt(2.0 * np.pi)


def _gradients(dy: Any, gate: Any, up: Any, kind: str) -> np.ndarray:
    g, u = halves(gate, up)
    dy64 = np.asarray(dy, np.float64)
    du = dy64 * stored_as(activation(g, kind), gate)
    dg = stored_as(dy64 * u, gate) * derivative(g, kind)
    return np.concatenate([dg, du], axis=-1) if up is None else np.stack([dg, du])


def swiglu_backward_reference(dy: Any, gate: Any, up: Any = None) -> np.ndarray:
    """float64 reference of the packed gradients."""
    return _gradients(dy, gate, up, "silu")


def geglu_backward_reference(dy: Any, gate: Any, up: Any = None, approximate: str = "none") -> np.ndarray:
    """float64 reference of the packed gradients."""
    return _gradients(dy, gate, up, approximate)


def _backward_schema(name: str, attrs: tuple[str, ...], reference: Any) -> OpSchema:
    return OpSchema(
        name=name,
        inputs=("dy", "gate", "up"),
        optional=frozenset({"up"}),
        attrs=attrs,
        defaults={"approximate": "none"} if attrs else {},
        normalize_attrs=_attrs,
        infer_dtype=glu_dtype,
        infer_shape=_shape,
        reference=reference,
        inplace=True,
        flops=lambda ctx: 10 * ctx.attrs["rows"] * ctx.attrs["hidden"],
        doc=f"Gradients of {name.removesuffix('_backward')}: [dgate; dup], or [dgate | dup] for a packed input.",
    )


SWIGLU_BACKWARD = _backward_schema("swiglu_backward", (), swiglu_backward_reference)
GEGLU_BACKWARD = _backward_schema("geglu_backward", ("approximate",), geglu_backward_reference)


def unpack(packed: Any, up: Any) -> Any:
    """(dgate, dup) views of the op's result for two inputs; the packed input's one gradient as it is."""
    return packed if up is None else (packed[0], packed[1])


def swiglu_backward(dy: Any, gate: Any, up: Any = None, *, out: Any = None) -> Any:
    """(dgate, dup) of swiglu(gate, up) for upstream gradient dy; for a packed gate, its one gradient."""
    return unpack(run("swiglu_backward", (dy, gate, up), (), out), up)


def geglu_backward(dy: Any, gate: Any, up: Any = None, approximate: str = "none", *, out: Any = None) -> Any:
    """(dgate, dup) of geglu(gate, up, approximate) for upstream gradient dy; for a packed gate, its gradient."""
    return unpack(run("geglu_backward", (dy, gate, up), (approximate,), out), up)
