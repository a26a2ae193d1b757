"""Elementwise ONNX ops: math, comparisons and logic, activations, Where, Clip, Cast, variadic Max / Min /
Sum / Mean, and the legacy broadcasting of opsets 1 to 6."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ...backends.cpu.fused_elementwise import erf
from ...errors import ShapeError
from ...graph.ir import GraphError, Node
from ..errors import UnsupportedModelError
from .record import Builder, F, Fn, LoadContext, broadcast_size, op, torch, torch_dtype


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _keep_dtype(fn: Callable) -> Builder:
    """A NumPy function whose result is cast back to its first input's dtype."""
    return lambda node, opset: lambda x, *rest: np.asarray(fn(x, *rest)).astype(x.dtype, copy=False)


def _plain(fn: Callable) -> Builder:
    """A function that takes no attributes, as a builder."""
    return lambda node, opset: fn


def _lazy(path: str) -> Builder:
    """A torch function by dotted name ('torch.relu'), looked up when the GPU path first builds it."""
    module, name = path.split(".", 1)
    return lambda node, opset: getattr(torch if module == "torch" else F, name)


# -- unary math ----------------------------------------------------------------------------------------
for _name, _numpy, _torch in (
    ("Sqrt", np.sqrt, "torch.sqrt"), ("Reciprocal", np.reciprocal, "torch.reciprocal"),
    ("Tanh", np.tanh, "torch.tanh"), ("Exp", np.exp, "torch.exp"), ("Log", np.log, "torch.log"),
    ("Neg", np.negative, "torch.neg"), ("Abs", np.abs, "torch.abs"), ("Sigmoid", _sigmoid, "torch.sigmoid"),
    ("Floor", np.floor, "torch.floor"), ("Ceil", np.ceil, "torch.ceil"), ("Sin", np.sin, "torch.sin"),
    ("Cos", np.cos, "torch.cos"), ("Sign", np.sign, "torch.sign"), ("Erf", erf, "torch.erf"),
    ("Tan", np.tan, "torch.tan"), ("Asin", np.arcsin, "torch.asin"), ("Acos", np.arccos, "torch.acos"),
    ("Atan", np.arctan, "torch.atan"), ("Sinh", np.sinh, "torch.sinh"), ("Cosh", np.cosh, "torch.cosh"),
    ("Asinh", np.arcsinh, "torch.asinh"), ("Acosh", np.arccosh, "torch.acosh"), ("Atanh", np.arctanh, "torch.atanh"),
):  # fmt: skip
    op(_name, _keep_dtype(_numpy), _lazy(_torch))

op("Relu", lambda node, opset: lambda x: np.maximum(x, x.dtype.type(0)), _lazy("torch.relu"))
op("Identity", _plain(lambda x: x), _plain(lambda x: x), views=True)
op("Not", _plain(np.logical_not), _lazy("torch.logical_not"))
op("IsNaN", _plain(np.isnan), _lazy("torch.isnan"))


def is_inf(node: Node, opset: int) -> Fn:
    negative, positive = node.attrs.get("detect_negative", 1), node.attrs.get("detect_positive", 1)
    if negative and positive:
        return lambda x: np.isinf(x)
    if positive or negative:
        return np.isposinf if positive else np.isneginf
    return lambda x: np.zeros(x.shape, bool)


def is_inf_torch(node: Node, opset: int) -> Fn:
    negative, positive = node.attrs.get("detect_negative", 1), node.attrs.get("detect_positive", 1)
    if negative and positive:
        return torch.isinf
    if positive or negative:
        return torch.isposinf if positive else torch.isneginf
    return lambda x: torch.zeros(x.shape, dtype=torch.bool, device=x.device)


op("IsInf", is_inf, is_inf_torch)


def gelu(node: Node, opset: int) -> Fn:
    if node.attrs.get("approximate", "none") == "tanh":
        c = math.sqrt(2.0 / math.pi)
        return lambda x: (0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * x**3)))).astype(x.dtype)
    return lambda x: (0.5 * x * (1.0 + erf(x / x.dtype.type(math.sqrt(2.0))))).astype(x.dtype)


def gelu_torch(node: Node, opset: int) -> Fn:
    approximate = node.attrs.get("approximate", "none")
    return lambda x: F.gelu(x, approximate=approximate)


op("Gelu", gelu, gelu_torch)


# -- activations with attributes -------------------------------------------------------------------------
def _activation(fn: Callable[[Any, dict], Any], keep_dtype: bool = True) -> Builder:
    def build(node: Node, opset: int) -> Fn:
        attrs = node.attrs
        if keep_dtype:
            return lambda x: np.asarray(fn(x, attrs)).astype(x.dtype, copy=False)
        return lambda x: fn(x, attrs)

    return build


def _selu(where: Callable, expm1: Callable) -> Callable[[Any, dict], Any]:
    return lambda x, a: (
        a.get("gamma", 1.0507009873554805) * where(x > 0, x, a.get("alpha", 1.6732632423543772) * expm1(x))
    )


def _shrink(where: Callable) -> Callable[[Any, dict], Any]:
    """x - bias above lambd, x + bias below -lambd, 0 between."""

    def shrink(x: Any, a: dict) -> Any:
        lambd, bias = a.get("lambd", 0.5), a.get("bias", 0.0)
        return where(x < -lambd, x + bias, where(x > lambd, x - bias, x * 0))

    return shrink


def _celu(x: np.ndarray, a: dict) -> np.ndarray:
    alpha = a.get("alpha", 1.0)
    return np.maximum(x, 0) + np.minimum(0, alpha * np.expm1(x / alpha))


ACTIVATIONS: dict[str, tuple[Callable, Callable]] = {
    "LeakyRelu": (
        lambda x, a: np.where(x >= 0, x, x * a.get("alpha", 0.01)),
        lambda x, a: F.leaky_relu(x, a.get("alpha", 0.01)),
    ),
    "Elu": (
        lambda x, a: np.where(x > 0, x, a.get("alpha", 1.0) * np.expm1(x)),
        lambda x, a: F.elu(x, a.get("alpha", 1.0)),
    ),
    "Celu": (_celu, lambda x, a: F.celu(x, a.get("alpha", 1.0))),
    "Selu": (_selu(np.where, np.expm1), _selu(lambda c, x, y: torch.where(c, x, y), lambda x: torch.expm1(x))),
    "Softplus": (lambda x, a: np.logaddexp(0, x), lambda x, a: F.softplus(x)),
    "Softsign": (lambda x, a: x / (1 + np.abs(x)), lambda x, a: F.softsign(x)),
    "HardSigmoid": (
        lambda x, a: np.clip(a.get("alpha", 0.2) * x + a.get("beta", 0.5), 0, 1),
        lambda x, a: torch.clamp(a.get("alpha", 0.2) * x + a.get("beta", 0.5), 0, 1),
    ),
    "HardSwish": (
        lambda x, a: x * np.clip(x / 6 + 0.5, 0, 1),
        lambda x, a: x * torch.clamp(x / 6 + 0.5, 0, 1),
    ),
    "ThresholdedRelu": (
        lambda x, a: np.where(x > a.get("alpha", 1.0), x, 0),
        lambda x, a: torch.where(x > a.get("alpha", 1.0), x, torch.zeros_like(x)),
    ),
    "Round": (lambda x, a: np.round(x), lambda x, a: torch.round(x)),
    "Mish": (lambda x, a: x * np.tanh(np.logaddexp(0, x)), lambda x, a: F.mish(x)),
    "Swish": (
        lambda x, a: x * _sigmoid(x * x.dtype.type(a.get("alpha", 1.0))),
        lambda x, a: x * torch.sigmoid(x * a.get("alpha", 1.0)),
    ),
    "Shrink": (_shrink(np.where), lambda x, a: _shrink(torch.where)(x, a).to(x.dtype)),
}


def _selu_1(node: Node, ctx: LoadContext) -> None:
    """Selu-1's defaults have fewer digits than Selu-6's: written out."""
    if ctx.graph.opset < 6:
        node.attrs.setdefault("alpha", float(np.float32(1.6732)))
        node.attrs.setdefault("gamma", float(np.float32(1.0507)))


for _name, (_numpy, _torch) in ACTIVATIONS.items():
    op(_name, _activation(_numpy), _activation(_torch, keep_dtype=False), upgrade=_selu_1 if _name == "Selu" else None)


def prelu_channel_shape(opset: int, x_shape: tuple[int, ...], slope_shape: tuple[int, ...]) -> tuple | None:
    """PRelu-1/6's 1-D slope of C values is per channel (dim 1 of N x C x ...), not along the last dim as
    NumPy would broadcast it: the (C, 1, ...) shape to give it, per run (the rank may be known only then)."""
    if opset >= 7 or len(x_shape) <= 2 or tuple(slope_shape) != (x_shape[1],):
        return None  # PRelu-7+, an N x C input, or not one value per channel: NumPy's rule applies
    return (x_shape[1],) + (1,) * (len(x_shape) - 2)


def prelu(node: Node, opset: int) -> Fn:
    def run(x: np.ndarray, slope: np.ndarray) -> np.ndarray:
        channels = prelu_channel_shape(opset, x.shape, slope.shape)
        slope = slope if channels is None else slope.reshape(channels)
        return np.where(x < 0, x * slope, x).astype(x.dtype, copy=False)

    return run


def prelu_torch(node: Node, opset: int) -> Fn:
    def run(x: Any, slope: Any) -> Any:
        channels = prelu_channel_shape(opset, tuple(x.shape), tuple(slope.shape))
        slope = slope if channels is None else slope.reshape(channels)
        return torch.where(x < 0, x * slope, x)

    return run


op("PRelu", prelu, prelu_torch, size=broadcast_size)


def swiglu(node: Node, opset: int) -> Fn:
    """Swish(A) * B, A and B of one shape (no broadcasting)."""
    alpha = node.attrs.get("alpha", 1.0)

    def run(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        _same_shape("SwiGLU", a, b)
        return (a * _sigmoid(a * a.dtype.type(alpha)) * b).astype(a.dtype, copy=False)

    return run


def swiglu_torch(node: Node, opset: int) -> Fn:
    alpha = node.attrs.get("alpha", 1.0)

    def run(a: Any, b: Any) -> Any:
        _same_shape("SwiGLU", a, b)
        return F.silu(a) * b if alpha == 1.0 else a * torch.sigmoid(a * alpha) * b

    return run


def _same_shape(op_name: str, a: Any, b: Any) -> None:
    if tuple(a.shape) != tuple(b.shape):
        raise ShapeError(f"{op_name}: A and B must have one shape (no broadcasting), got {tuple(a.shape)} "
                         f"and {tuple(b.shape)}")  # fmt: skip


op("SwiGLU", swiglu, swiglu_torch)


# -- binary ops and their legacy broadcasting ----------------------------------------------------------------
def legacy_broadcast(node: Node, ctx: LoadContext) -> None:
    """Opsets 1 to 6: without broadcast=1, A and B have one shape; with it and no axis, B matches A's trailing
    dims (both NumPy's rule). With an axis, B's dims sit at A's dims axis, axis+1, ...: B gets trailing 1s."""
    graph = ctx.graph
    if graph.opset >= 7:
        return
    node.attrs.pop("consumed_inputs", None)
    broadcast, axis = node.attrs.pop("broadcast", 0), node.attrs.pop("axis", None)
    if not broadcast or axis is None or len(node.inputs) != 2:
        return
    a, b = node.inputs
    rank_a, rank_b = ctx.rank(a), ctx.rank(b)
    if rank_a is None or rank_b is None:
        unknown = [name for name, rank in ((a, rank_a), (b, rank_b)) if rank is None]
        raise UnsupportedModelError(
            f"{node.describe()}: broadcast=1 with axis={axis} needs the ranks of its inputs, and the model does "
            f"not declare the shapes of {unknown}"
        )
    axis = axis + rank_a if axis < 0 else axis
    pad = rank_a - axis - rank_b
    if pad < 0 or axis < 0:
        raise GraphError(
            f"{node.describe()}: broadcast axis {axis} does not fit a rank-{rank_b} B into a rank-{rank_a} A"
        )
    if pad == 0:
        return
    # an Unsqueeze even for a constant B: folded while optimizing or planning, and right for a fed one
    aligned = graph.fresh_name(f"{b}_aligned")
    unsqueeze = Node("Unsqueeze", [b], [aligned], {"axes": list(range(rank_b, rank_b + pad))}, aligned)
    graph.nodes.insert(graph.nodes.index(node), unsqueeze)  # Unsqueeze-1: axes is an attribute
    node.inputs[1] = aligned


def divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "iu":  # integer division truncates toward zero, as in C
        q = np.floor_divide(a, b)
        fix = (np.remainder(a, b) != 0) & ((a < 0) != (b < 0))
        return q + fix.astype(q.dtype)
    return np.divide(a, b)


def power(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "iu":
        return np.power(a.astype(np.float64), b.astype(np.float64))
    return np.power(a, b.astype(a.dtype, copy=False) if b.dtype.kind in "iub" else b)


def _divide_torch(a: Any, b: Any) -> Any:
    return a / b if a.is_floating_point() else torch.div(a, b, rounding_mode="trunc")


BINARY: dict[str, tuple[Builder, Builder]] = {
    "Add": (_keep_dtype(np.add), _lazy("torch.add")),
    "Sub": (_keep_dtype(np.subtract), _lazy("torch.sub")),
    "Mul": (_keep_dtype(np.multiply), _lazy("torch.mul")),
    "Div": (_keep_dtype(divide), _plain(_divide_torch)),
    "Pow": (_keep_dtype(power), _plain(lambda a, b: torch.pow(a, b).to(a.dtype))),
    "Equal": (_plain(np.equal), _lazy("torch.eq")),
    "Greater": (_plain(np.greater), _lazy("torch.gt")),
    "Less": (_plain(np.less), _lazy("torch.lt")),
    "And": (_plain(np.logical_and), _lazy("torch.logical_and")),
    "Or": (_plain(np.logical_or), _lazy("torch.logical_or")),
    "Xor": (_plain(np.logical_xor), _lazy("torch.logical_xor")),
}
for _name, (_numpy, _torch) in BINARY.items():  # the ops of opsets 1 to 6 with `broadcast` and `axis`
    op(_name, _numpy, _torch, upgrade=legacy_broadcast, size=broadcast_size)
op("GreaterOrEqual", _plain(np.greater_equal), _lazy("torch.ge"), size=broadcast_size)
op("LessOrEqual", _plain(np.less_equal), _lazy("torch.le"), size=broadcast_size)


def mod(node: Node, opset: int) -> Fn:
    fmod = bool(node.attrs.get("fmod", 0))
    return lambda a, b: (np.fmod(a, b) if fmod else np.mod(a, b)).astype(a.dtype, copy=False)


def mod_torch(node: Node, opset: int) -> Fn:
    return lambda a, b: torch.fmod(a, b) if node.attrs.get("fmod", 0) else torch.remainder(a, b)


op("Mod", mod, mod_torch, size=broadcast_size)


# -- variadic ops ----------------------------------------------------------------------------------------------
def _total(xs: tuple) -> Any:
    return functools.reduce(lambda a, b: a + b, xs)


op("Max", _keep_dtype(lambda *xs: functools.reduce(np.maximum, xs)),
   _plain(lambda *xs: functools.reduce(torch.maximum, xs)), size=broadcast_size)  # fmt: skip
op("Min", _keep_dtype(lambda *xs: functools.reduce(np.minimum, xs)),
   _plain(lambda *xs: functools.reduce(torch.minimum, xs)), size=broadcast_size)  # fmt: skip
op("Sum", _keep_dtype(lambda *xs: _total(xs)), _plain(lambda *xs: _total(xs)), size=broadcast_size)
op("Mean", _keep_dtype(lambda *xs: _total(xs) / len(xs)), _plain(lambda *xs: (_total(xs) / len(xs)).to(xs[0].dtype)),
   size=broadcast_size)  # fmt: skip
op("Where", _plain(np.where), _lazy("torch.where"), size=broadcast_size)


# -- Clip and casts --------------------------------------------------------------------------------------------
FLOAT_MAX = float(np.finfo(np.float32).max)


def clip_6(node: Node, ctx: LoadContext) -> None:
    """Clip-6 clamps to the float range by default (min and max are attributes before opset 11)."""
    if 6 <= ctx.graph.opset < 11:
        node.attrs.setdefault("min", -FLOAT_MAX)
        node.attrs.setdefault("max", FLOAT_MAX)


def clip(node: Node, opset: int) -> Fn:
    lo_attr, hi_attr = node.attrs.get("min"), node.attrs.get("max")

    def run(x: np.ndarray, lo: Any = None, hi: Any = None) -> np.ndarray:
        lo = lo_attr if lo is None else lo
        hi = hi_attr if hi is None else hi
        y = x
        if lo is not None:
            y = np.maximum(y, np.asarray(lo, x.dtype))
        if hi is not None:
            y = np.minimum(y, np.asarray(hi, x.dtype))
        return np.asarray(y, x.dtype)

    return run


def clip_torch(node: Node, opset: int) -> Fn:
    lo_attr, hi_attr = node.attrs.get("min"), node.attrs.get("max")

    def run(x: Any, lo: Any = None, hi: Any = None) -> Any:
        lo, hi = (lo_attr if lo is None else lo), (hi_attr if hi is None else hi)
        return x.clone() if lo is None and hi is None else torch.clamp(x, lo, hi)

    return run


op("Clip", clip, clip_torch, upgrade=clip_6)


def cast(node: Node, opset: int) -> Fn:
    target = np.dtype(node.attrs["to"])
    return lambda x: x.astype(target)


def cast_torch(node: Node, opset: int) -> Fn:
    target = torch_dtype(node.attrs["to"])
    return lambda x: x.to(target)


op("Cast", cast, cast_torch)
op("CastLike", _plain(lambda x, like: x.astype(like.dtype)), _plain(lambda x, like: x.to(like.dtype)))
