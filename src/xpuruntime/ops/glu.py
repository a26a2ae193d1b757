"""swiglu(gate, up) = silu(gate) * up and geglu(gate, up, approximate) = gelu(gate) * up: the gated MLP
activations of Llama / Mistral / Qwen2 (SwiGLU) and Gemma / T5 v1.1 (GeGLU).

From two projections, or from one packed projection: with `up=None`, `gate`'s last dimension holds the two
halves [gate | up] (a fused gate_up projection, as Phi-3's gate_up_proj or vLLM's SiluAndMul take it), and
the result has half that width. `approximate` is F.gelu's: "none" (erf) or "tanh".

The result is PyTorch's eager `act(gate) * up` in the input dtype: act rounded to that dtype, then the
product rounded (fp32 math in between; float64 stays float64), so that the fused op gives the unfused
module's values bit for bit wherever both compute the activation alike. Backward: ops/glu_backward.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..context import DispatchContext
from ..dispatch import run
from ..errors import ArgumentError, ShapeError, argument_error
from ..schema import OpSchema
from .checks import numel, require_dtype_like, require_float, require_ndim, stored_as
from .fused_elementwise import UNARY

APPROXIMATIONS = ("none", "tanh")


def glu_attrs(ctx: DispatchContext) -> dict[str, Any]:
    """packed (up is None), rows and hidden (the width of each half), and geglu's approximation."""
    require_ndim(ctx, "gate", 1)
    gate = ctx.tensor("gate").shape
    packed = not ctx.has_tensor("up")
    if packed and gate[-1] % 2:
        raise argument_error(ShapeError, ctx.op, "gate", "an even last dimension (packed [gate | up] halves, as "
                             "up=None means)", f"shape {gate}")  # fmt: skip
    if not packed and ctx.tensor("up").shape != gate:
        raise argument_error(ShapeError, ctx.op, "up", f"shape {gate} (that of gate)", ctx.tensor("up").shape)
    attrs = {"packed": packed, "rows": numel(gate[:-1]), "hidden": gate[-1] // 2 if packed else gate[-1]}
    if "approximate" in ctx.attrs:
        attrs["approximate"] = check_approximate(ctx)
    return attrs


def check_approximate(ctx: DispatchContext) -> str:
    approximate = ctx.attrs["approximate"]
    if approximate not in APPROXIMATIONS:
        raise argument_error(ArgumentError, ctx.op, "approximate", f"one of {APPROXIMATIONS}", repr(approximate))
    return approximate


def glu_dtype(ctx: DispatchContext) -> str:
    dtype = require_float(ctx, "gate")
    for name in ("up", "dy"):
        if name in ctx.arg_names:
            require_dtype_like(ctx, name, "gate")
    return dtype


def halves(gate: Any, up: Any) -> tuple[np.ndarray, np.ndarray]:
    """(gate, up) as float64, split from the packed gate when up is None."""
    g = np.asarray(gate, np.float64)
    if up is None:
        h = g.shape[-1] // 2
        return g[..., :h], g[..., h:]
    return g, np.asarray(up, np.float64)


def activation(g: np.ndarray, kind: str) -> np.ndarray:
    """float64 silu, or gelu with F.gelu's `approximate` ("none", "tanh")."""
    with np.errstate(over="ignore", invalid="ignore"):
        if kind == "silu":
            return g * UNARY["sigmoid"](g)
        return UNARY["gelu_tanh" if kind == "tanh" else "gelu"](g)


def swiglu_reference(gate: Any, up: Any = None) -> np.ndarray:
    """float64 reference: silu(gate) stored in the input dtype, times up."""
    g, u = halves(gate, up)
    return stored_as(activation(g, "silu"), gate) * u


def geglu_reference(gate: Any, up: Any = None, approximate: str = "none") -> np.ndarray:
    """float64 reference: gelu(gate) stored in the input dtype, times up."""
    g, u = halves(gate, up)
    return stored_as(activation(g, approximate), gate) * u


def _glu_schema(name: str, attrs: tuple[str, ...], reference: Any, doc: str) -> OpSchema:
    return OpSchema(
        name=name,
        inputs=("gate", "up"),
        optional=frozenset({"up"}),
        attrs=attrs,
        defaults={"approximate": "none"} if attrs else {},
        normalize_attrs=glu_attrs,
        infer_dtype=glu_dtype,
        infer_shape=lambda ctx: (*ctx.tensor("gate").shape[:-1], ctx.attrs["hidden"]),
        reference=reference,
        inplace=True,
        flops=lambda ctx: 6 * ctx.attrs["rows"] * ctx.attrs["hidden"],
        doc=doc,
    )


SWIGLU = _glu_schema("swiglu", (), swiglu_reference, "silu(gate) * up; up=None: gate packs [gate | up].")
GEGLU = _glu_schema("geglu", ("approximate",), geglu_reference, "gelu(gate) * up; up=None: gate packs [gate | up].")


def swiglu(gate: Any, up: Any = None, *, out: Any = None) -> Any:
    """silu(gate) * up, as PyTorch computes it in the input dtype; up=None: gate's last dim is [gate | up]."""
    return run("swiglu", (gate, up), (), out)


def geglu(gate: Any, up: Any = None, approximate: str = "none", *, out: Any = None) -> Any:
    """gelu(gate, approximate) * up, as PyTorch computes it in the input dtype; up=None: gate packs both."""
    return run("geglu", (gate, up), (approximate,), out)
