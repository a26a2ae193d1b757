"""NumPy implementations of the ONNX ops the session runs itself (shape and index ops, and every op's
fallback). A builder parses a node's attributes once, at load time, and returns a small function of
the node's input arrays that returns its output (or a tuple for several outputs)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..backends.cpu.fused_elementwise import erf
from ..errors import ArgumentError, ShapeError
from ..graph.ir import Node
from .resize import resize, resize_spec

Fn = Callable[..., Any]
Builder = Callable[[Node, int], Fn]
OPS: dict[str, Builder] = {}


def op(*names: str) -> Callable[[Builder], Builder]:
    def register(builder: Builder) -> Builder:
        for name in names:
            OPS[name] = builder
        return builder

    return register


def _axis(op: str, axis: int, ndim: int) -> int:
    """`axis` in [-ndim, ndim) as a non-negative index; ShapeError naming the op otherwise."""
    if not -ndim <= axis < ndim:
        raise ShapeError(f"{op}: axis {axis} is out of range for a {ndim}-d input")
    return axis % ndim


def _check_indices(op: str, indices: np.ndarray, dim: int, axis: int, shape: tuple[int, ...]) -> None:
    """Gather-style indices must lie in [-dim, dim) of the gathered axis; ArgumentError naming the op."""
    if indices.size and (indices.min() < -dim or indices.max() >= dim):
        raise ArgumentError(f"{op}: indices outside [-{dim}, {dim}) for axis {axis} of shape {shape}")


def _unary(fn: Callable[[np.ndarray], np.ndarray]) -> Builder:
    def build(node: Node, opset: int) -> Fn:
        return lambda x: np.asarray(fn(x)).astype(x.dtype, copy=False)

    return build


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


for _name, _fn in {
    "Sqrt": np.sqrt, "Reciprocal": np.reciprocal, "Tanh": np.tanh, "Exp": np.exp, "Log": np.log,
    "Neg": np.negative, "Abs": np.abs, "Sigmoid": _sigmoid, "Floor": np.floor, "Ceil": np.ceil,
    "Sin": np.sin, "Cos": np.cos, "Sign": np.sign, "Erf": erf,
}.items():  # fmt: skip
    OPS[_name] = _unary(_fn)


@op("Relu")
def _relu(node: Node, opset: int) -> Fn:
    return lambda x: np.maximum(x, x.dtype.type(0))


@op("Gelu")
def _gelu(node: Node, opset: int) -> Fn:
    if node.attrs.get("approximate", "none") == "tanh":
        c = math.sqrt(2.0 / math.pi)
        return lambda x: (0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * x**3)))).astype(x.dtype)
    return lambda x: (0.5 * x * (1.0 + erf(x / x.dtype.type(math.sqrt(2.0))))).astype(x.dtype)


@op("Identity")
def _identity(node: Node, opset: int) -> Fn:
    return lambda x: x


@op("Not")
def _not(node: Node, opset: int) -> Fn:
    return np.logical_not


@op("IsNaN")
def _isnan(node: Node, opset: int) -> Fn:
    return np.isnan


def _binary(fn: Callable[[np.ndarray, np.ndarray], np.ndarray], keep_dtype: bool = True) -> Builder:
    def build(node: Node, opset: int) -> Fn:
        if keep_dtype:
            return lambda a, b: np.asarray(fn(a, b)).astype(a.dtype, copy=False)
        return fn

    return build


def _divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "iu":  # integer division truncates toward zero, as in C
        q = np.floor_divide(a, b)
        fix = (np.remainder(a, b) != 0) & ((a < 0) != (b < 0))
        return q + fix.astype(q.dtype)
    return np.divide(a, b)


def _power(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "iu":
        return np.power(a.astype(np.float64), b.astype(np.float64))
    return np.power(a, b.astype(a.dtype, copy=False) if b.dtype.kind in "iub" else b)


OPS.update(
    Add=_binary(np.add), Sub=_binary(np.subtract), Mul=_binary(np.multiply), Div=_binary(_divide),
    Pow=_binary(_power), Equal=_binary(np.equal, False), Greater=_binary(np.greater, False),
    Less=_binary(np.less, False), GreaterOrEqual=_binary(np.greater_equal, False),
    LessOrEqual=_binary(np.less_equal, False), And=_binary(np.logical_and, False),
    Or=_binary(np.logical_or, False), Xor=_binary(np.logical_xor, False),
)  # fmt: skip


@op("Max", "Min")
def _max_min(node: Node, opset: int) -> Fn:
    fn = np.maximum if node.op == "Max" else np.minimum

    def run(*xs: np.ndarray) -> np.ndarray:
        result = xs[0]
        for x in xs[1:]:
            result = fn(result, x)
        return np.asarray(result).astype(xs[0].dtype, copy=False)

    return run


@op("Where")
def _where(node: Node, opset: int) -> Fn:
    return np.where


@op("Clip")
def _clip(node: Node, opset: int) -> Fn:
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


@op("Cast")
def _cast(node: Node, opset: int) -> Fn:
    target = np.dtype(node.attrs["to"])
    return lambda x: x.astype(target)


@op("CastLike")
def _cast_like(node: Node, opset: int) -> Fn:
    return lambda x, like: x.astype(like.dtype)


# -- matmul family --------------------------------------------------------------------------------
@op("MatMul")
def _matmul(node: Node, opset: int) -> Fn:
    return np.matmul


@op("Gemm")
def _gemm(node: Node, opset: int) -> Fn:
    alpha, beta = node.attrs.get("alpha", 1.0), node.attrs.get("beta", 1.0)
    trans_a, trans_b = node.attrs.get("transA", 0), node.attrs.get("transB", 0)

    def run(a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None) -> np.ndarray:
        y = np.matmul(a.T if trans_a else a, b.T if trans_b else b)
        if alpha != 1.0:
            y = y * a.dtype.type(alpha)
        if c is not None:
            y = y + (c if beta == 1.0 else c * a.dtype.type(beta))
        return y.astype(a.dtype, copy=False)

    return run


# -- normalization and softmax ---------------------------------------------------------------------
@op("Softmax", "LogSoftmax")
def _softmax(node: Node, opset: int) -> Fn:
    log = node.op == "LogSoftmax"
    axis = node.attrs.get("axis", -1 if opset >= 13 else 1)

    def softmax(x: np.ndarray, ax: int) -> np.ndarray:
        shifted = x - np.max(x, axis=ax, keepdims=True)
        e = np.exp(shifted)
        s = np.sum(e, axis=ax, keepdims=True)
        return (shifted - np.log(s)) if log else e / s

    def run(x: np.ndarray) -> np.ndarray:
        if x.size == 0:
            return x.copy()
        if opset >= 13:
            return softmax(x, axis).astype(x.dtype, copy=False)
        ax = axis % max(x.ndim, 1)
        flat = x.reshape(math.prod(x.shape[:ax]), -1)
        return softmax(flat, 1).reshape(x.shape).astype(x.dtype, copy=False)

    return run


@op("LayerNormalization")
def _layer_norm(node: Node, opset: int) -> Fn:
    axis, eps = node.attrs.get("axis", -1), node.attrs.get("epsilon", 1e-5)

    def run(x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None = None) -> tuple:
        ax = _axis("LayerNormalization", axis, x.ndim)
        axes = tuple(range(ax, x.ndim))
        xf = x.astype(np.float32) if x.dtype == np.float16 else x
        mean = xf.mean(axis=axes, keepdims=True)
        centered = xf - mean
        inv_std = 1.0 / np.sqrt(np.mean(centered * centered, axis=axes, keepdims=True) + eps)
        y = centered * inv_std * scale
        if bias is not None:
            y = y + bias
        return y.astype(x.dtype), mean.astype(np.float32), inv_std.astype(np.float32)

    return run


# -- reductions ------------------------------------------------------------------------------------
_REDUCE_AXES_AS_INPUT = {"ReduceSum": 13}  # the others take axes as an input from opset 18


def _reduce(fn: Callable, empty: Callable[[np.dtype], Any] | None) -> Builder:
    def build(node: Node, opset: int) -> Fn:
        keepdims = bool(node.attrs.get("keepdims", 1))
        noop = bool(node.attrs.get("noop_with_empty_axes", 0))
        attr_axes = node.attrs.get("axes")
        axes_as_input = opset >= _REDUCE_AXES_AS_INPUT.get(node.op, 18)

        def run(x: np.ndarray, axes: np.ndarray | None = None) -> np.ndarray:
            raw = (None if axes is None else axes.tolist()) if axes_as_input else attr_axes
            if not raw:
                if noop:
                    return x
                raw = list(range(x.ndim))
            ax = tuple(sorted(_axis(node.op, a, x.ndim) for a in raw))
            if empty is not None and any(x.shape[a] == 0 for a in ax):
                shape = tuple(1 if i in ax else n for i, n in enumerate(x.shape) if keepdims or i not in ax)
                return np.full(shape, empty(x.dtype), x.dtype)
            return np.asarray(fn(x, axis=ax, keepdims=keepdims)).astype(x.dtype, copy=False)

        return run

    return build


def _lowest(dtype: np.dtype) -> Any:
    return -np.inf if dtype.kind == "f" else (False if dtype.kind == "b" else np.iinfo(dtype).min)


def _highest(dtype: np.dtype) -> Any:
    return np.inf if dtype.kind == "f" else (True if dtype.kind == "b" else np.iinfo(dtype).max)


OPS.update(
    ReduceSum=_reduce(np.sum, None), ReduceMean=_reduce(np.mean, lambda d: np.nan),
    ReduceMax=_reduce(np.max, _lowest), ReduceMin=_reduce(np.min, _highest), ReduceProd=_reduce(np.prod, None),
    ReduceL1=_reduce(lambda x, **k: np.sum(np.abs(x), **k), None),
    ReduceL2=_reduce(lambda x, **k: np.sqrt(np.sum(np.square(x), **k)), None),
    ReduceSumSquare=_reduce(lambda x, **k: np.sum(np.square(x), **k), None),
    ReduceLogSum=_reduce(lambda x, **k: np.log(np.sum(x, **k)), None),
    ReduceLogSumExp=_reduce(lambda x, **k: np.log(np.sum(np.exp(x.astype(np.float64)), **k)), None),
)  # fmt: skip


# -- shape ops -------------------------------------------------------------------------------------
def _ints(x: np.ndarray | None) -> list[int]:
    return [] if x is None else [int(v) for v in np.asarray(x).reshape(-1)]


@op("Shape")
def _shape(node: Node, opset: int) -> Fn:
    start, end = node.attrs.get("start", 0), node.attrs.get("end")
    return lambda x: np.array(tuple(x.shape)[start:end], np.int64)


@op("Size")
def _size(node: Node, opset: int) -> Fn:
    return lambda x: np.array(math.prod(x.shape), np.int64)


@op("Reshape")
def _reshape(node: Node, opset: int) -> Fn:
    allowzero = bool(node.attrs.get("allowzero", 0))

    def run(x: np.ndarray, shape: np.ndarray) -> np.ndarray:
        dims = _ints(shape)
        if not allowzero:
            dims = [x.shape[i] if d == 0 and i < x.ndim else d for i, d in enumerate(dims)]
        try:
            return x.reshape(dims)
        except ValueError:
            raise ShapeError(f"Reshape: cannot reshape {x.shape} to {tuple(_ints(shape))}") from None

    return run


@op("Flatten")
def _flatten(node: Node, opset: int) -> Fn:
    axis = node.attrs.get("axis", 1)

    def run(x: np.ndarray) -> np.ndarray:
        ax = axis % x.ndim if axis < 0 else axis
        return x.reshape(math.prod(x.shape[:ax]), math.prod(x.shape[ax:]))

    return run


@op("Transpose")
def _transpose(node: Node, opset: int) -> Fn:
    perm = node.attrs.get("perm")
    return lambda x: np.transpose(x, perm)


@op("Squeeze")
def _squeeze(node: Node, opset: int) -> Fn:
    attr_axes = node.attrs.get("axes")

    def run(x: np.ndarray, axes: np.ndarray | None = None) -> np.ndarray:
        raw = _ints(axes) if opset >= 13 else attr_axes
        if not raw:
            return np.squeeze(x)
        ax = tuple(_axis("Squeeze", a, x.ndim) for a in raw)
        if any(x.shape[a] != 1 for a in ax):
            raise ShapeError(f"Squeeze: axes {raw} of shape {x.shape} are not all 1")
        return np.squeeze(x, axis=ax)

    return run


@op("Unsqueeze")
def _unsqueeze(node: Node, opset: int) -> Fn:
    attr_axes = node.attrs.get("axes")

    def run(x: np.ndarray, axes: np.ndarray | None = None) -> np.ndarray:
        raw = _ints(axes) if opset >= 13 else list(attr_axes or ())
        rank = x.ndim + len(raw)
        ax = sorted(_axis("Unsqueeze", a, rank) for a in raw)
        if len(set(ax)) != len(ax):
            raise ArgumentError(f"Unsqueeze: repeated axes {raw}")
        return np.expand_dims(x, tuple(ax))

    return run


@op("Concat")
def _concat(node: Node, opset: int) -> Fn:
    axis = node.attrs["axis"]
    return lambda *xs: np.concatenate(xs, axis=axis)


@op("Split")
def _split(node: Node, opset: int) -> Fn:
    axis, count = node.attrs.get("axis", 0), len(node.outputs)
    attr_split, num_outputs = node.attrs.get("split"), node.attrs.get("num_outputs")

    def run(x: np.ndarray, split: np.ndarray | None = None) -> tuple:
        ax = _axis("Split", axis, x.ndim)
        sizes = _ints(split) if split is not None else list(attr_split or ())  # Split-1 takes either
        n = x.shape[ax]
        if not sizes:
            parts = num_outputs or count
            chunk = -(-n // parts)
            sizes = [min(chunk, max(n - i * chunk, 0)) for i in range(parts)]
        if sum(sizes) != n:
            raise ShapeError(f"Split: sizes {sizes} do not add up to dim {n} of axis {axis}")
        return tuple(np.split(x, np.cumsum(sizes)[:-1], axis=ax))

    return run


@op("Slice")
def _slice(node: Node, opset: int) -> Fn:
    def run(x: np.ndarray, starts: Any, ends: Any, axes: Any = None, steps: Any = None) -> np.ndarray:
        starts, ends = _ints(starts), _ints(ends)
        axes = _ints(axes) if axes is not None else list(range(len(starts)))
        steps = _ints(steps) if steps is not None else [1] * len(starts)
        index = [slice(None)] * x.ndim
        for start, end, axis, step in zip(starts, ends, axes, steps):
            if step == 0:
                raise ArgumentError("Slice: a step of 0")
            dim = x.shape[axis]
            start = start + dim if start < 0 else start
            end = end + dim if end < 0 else end
            if step > 0:
                start, end = min(max(start, 0), dim), min(max(end, 0), dim)
            else:
                start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
            index[axis] = slice(start, None if end < 0 else end, step)
        return x[tuple(index)]

    if opset < 10:  # Slice-1: starts, ends and axes are attributes
        bounds = (node.attrs["starts"], node.attrs["ends"], node.attrs.get("axes"))
        return lambda x: run(x, *bounds)
    return run


@op("Gather")
def _gather(node: Node, opset: int) -> Fn:
    axis = node.attrs.get("axis", 0)

    def run(x: np.ndarray, indices: np.ndarray) -> np.ndarray:
        ax = _axis("Gather", axis, x.ndim)
        _check_indices("Gather", indices, x.shape[ax], axis, x.shape)
        return np.take(x, indices, axis=ax)

    return run


@op("Expand")
def _expand(node: Node, opset: int) -> Fn:
    def run(x: np.ndarray, shape: np.ndarray) -> np.ndarray:
        target = np.broadcast_shapes(x.shape, tuple(_ints(shape)))
        return np.broadcast_to(x, target)

    return run


@op("Tile")
def _tile(node: Node, opset: int) -> Fn:
    if opset < 6:  # Tile-1: `tiles` copies along one `axis`, both inputs

        def along(x: np.ndarray, tiles: np.ndarray, axis: np.ndarray) -> np.ndarray:
            repeats = [1] * x.ndim
            repeats[_axis("Tile", _ints(axis)[0], x.ndim)] = _ints(tiles)[0]
            return np.tile(x, repeats)

        return along
    return lambda x, repeats: np.tile(x, _ints(repeats))


@op("Range")
def _range(node: Node, opset: int) -> Fn:
    def run(start: np.ndarray, limit: np.ndarray, delta: np.ndarray) -> np.ndarray:
        s, lim, d = start.item(), limit.item(), delta.item()
        if d == 0:
            raise ArgumentError("Range: delta is 0")
        n = max(math.ceil((lim - s) / d), 0)
        return (s + d * np.arange(n)).astype(start.dtype)

    return run


@op("ConstantOfShape")
def _constant_of_shape(node: Node, opset: int) -> Fn:
    value = node.attrs.get("value")
    fill = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)

    def run(shape: np.ndarray) -> np.ndarray:
        dims = _ints(shape)
        if any(d < 0 for d in dims):
            raise ShapeError(f"ConstantOfShape: negative dims {dims}")
        return np.full(dims, fill[0], fill.dtype)

    return run


# -- more activations and ops real models use ----------------------------------------------------------
def _activation(fn: Callable[[np.ndarray, dict], np.ndarray]) -> Builder:
    def build(node: Node, opset: int) -> Fn:
        attrs = node.attrs
        return lambda x: np.asarray(fn(x, attrs)).astype(x.dtype, copy=False)

    return build


OPS.update(
    LeakyRelu=_activation(lambda x, a: np.where(x >= 0, x, x * a.get("alpha", 0.01))),
    Elu=_activation(lambda x, a: np.where(x > 0, x, a.get("alpha", 1.0) * np.expm1(x))),
    Celu=_activation(
        lambda x, a: np.maximum(x, 0) + np.minimum(0, a.get("alpha", 1.0) * np.expm1(x / a.get("alpha", 1.0)))
    ),
    Selu=_activation(lambda x, a: a.get("gamma", 1.0507009873554805) * np.where(
        x > 0, x, a.get("alpha", 1.6732632423543772) * np.expm1(x))),
    Softplus=_activation(lambda x, a: np.logaddexp(0, x)),
    Softsign=_activation(lambda x, a: x / (1 + np.abs(x))),
    HardSigmoid=_activation(lambda x, a: np.clip(a.get("alpha", 0.2) * x + a.get("beta", 0.5), 0, 1)),
    HardSwish=_activation(lambda x, a: x * np.clip(x / 6 + 0.5, 0, 1)),
    ThresholdedRelu=_activation(lambda x, a: np.where(x > a.get("alpha", 1.0), x, 0)),
    Round=_activation(lambda x, a: np.round(x)),
)  # fmt: skip


def prelu_channel_shape(opset: int, x_shape: tuple[int, ...], slope_shape: tuple[int, ...]) -> tuple | None:
    """PRelu-1/6's 1-D slope of C values is per channel (dim 1 of N x C x ...), not along the last dim as
    NumPy would broadcast it: the (C, 1, ...) shape to give it, per run (the rank may be known only then)."""
    if opset >= 7 or len(x_shape) <= 2 or tuple(slope_shape) != (x_shape[1],):
        return None  # PRelu-7+, an N x C input, or not one value per channel: NumPy's rule applies
    return (x_shape[1],) + (1,) * (len(x_shape) - 2)


@op("PRelu")
def _prelu(node: Node, opset: int) -> Fn:
    def run(x: np.ndarray, slope: np.ndarray) -> np.ndarray:
        channels = prelu_channel_shape(opset, x.shape, slope.shape)
        slope = slope if channels is None else slope.reshape(channels)
        return np.where(x < 0, x * slope, x).astype(x.dtype, copy=False)

    return run


@op("Mod")
def _mod(node: Node, opset: int) -> Fn:
    fmod = bool(node.attrs.get("fmod", 0))
    return lambda a, b: (np.fmod(a, b) if fmod else np.mod(a, b)).astype(a.dtype, copy=False)


@op("Sum", "Mean")
def _sum_mean(node: Node, opset: int) -> Fn:
    mean = node.op == "Mean"

    def run(*xs: np.ndarray) -> np.ndarray:
        total = xs[0]
        for x in xs[1:]:
            total = total + x
        return np.asarray(total / len(xs) if mean else total).astype(xs[0].dtype, copy=False)

    return run


@op("ArgMax", "ArgMin")
def _arg(node: Node, opset: int) -> Fn:
    axis, keepdims = node.attrs.get("axis", 0), bool(node.attrs.get("keepdims", 1))
    last = bool(node.attrs.get("select_last_index", 0))
    fn = np.argmax if node.op == "ArgMax" else np.argmin

    def run(x: np.ndarray) -> np.ndarray:
        ax = _axis(node.op, axis, x.ndim)
        if last:
            flipped = np.flip(x, ax)
            result = x.shape[ax] - 1 - fn(flipped, axis=ax, keepdims=keepdims)
        else:
            result = fn(x, axis=ax, keepdims=keepdims)
        return np.asarray(result, np.int64)

    return run


@op("CumSum")
def _cumsum(node: Node, opset: int) -> Fn:
    exclusive, reverse = bool(node.attrs.get("exclusive", 0)), bool(node.attrs.get("reverse", 0))

    def run(x: np.ndarray, axis: np.ndarray) -> np.ndarray:
        ax = _axis("CumSum", int(np.asarray(axis).reshape(-1)[0]), x.ndim)
        y = np.flip(x, ax) if reverse else x
        out = np.cumsum(y, axis=ax, dtype=x.dtype)
        if exclusive and out.shape[ax]:
            out = np.concatenate(
                [np.zeros_like(np.take(out, [0], axis=ax)), np.take(out, range(out.shape[ax] - 1), axis=ax)], axis=ax
            )
        return np.flip(out, ax) if reverse else out

    return run


@op("Trilu")
def _trilu(node: Node, opset: int) -> Fn:
    upper = bool(node.attrs.get("upper", 1))

    def run(x: np.ndarray, k: np.ndarray | None = None) -> np.ndarray:
        diagonal = 0 if k is None else int(np.asarray(k).reshape(-1)[0])
        return np.triu(x, diagonal) if upper else np.tril(x, diagonal)

    return run


@op("GatherElements")
def _gather_elements(node: Node, opset: int) -> Fn:
    axis = node.attrs.get("axis", 0)

    def run(x: np.ndarray, indices: np.ndarray) -> np.ndarray:
        ax = _axis("GatherElements", axis, x.ndim)
        dim = x.shape[ax]
        _check_indices("GatherElements", indices, dim, axis, x.shape)
        return np.take_along_axis(x, np.where(indices < 0, indices + dim, indices), axis=ax)

    return run


@op("Einsum")
def _einsum(node: Node, opset: int) -> Fn:
    equation = node.attrs["equation"].replace(" ", "")
    return lambda *xs: np.asarray(np.einsum(equation, *xs)).astype(xs[0].dtype, copy=False)


# -- padding, resizing, top-k, dropout -----------------------------------------------------------------
PAD_MODES = ("constant", "reflect", "edge", "wrap")


def pad_widths(op: str, shape: tuple[int, ...], pads: Any, axes: Any = None) -> list[tuple[int, int]]:
    """Pad-11+ `pads` ([begin..., end...] over `axes`, all axes by default) as (begin, end) per dim."""
    values, rank = _ints(pads), len(shape)
    picked = [_axis(op, a, rank) for a in _ints(axes)] if axes is not None else list(range(rank))
    if len(values) != 2 * len(picked) or len(set(picked)) != len(picked):
        raise ShapeError(f"{op}: {len(values)} pads for axes {picked} of an input of shape {shape}")
    widths = [(0, 0)] * rank
    for i, axis in enumerate(picked):
        widths[axis] = (values[i], values[len(picked) + i])
    if any(n + begin + end < 0 for n, (begin, end) in zip(shape, widths)):
        raise ShapeError(f"{op}: pads {values} remove more than the input's shape {shape} holds")
    return widths


def pad_source(n: int, begin: int, end: int, mode: str) -> np.ndarray:
    """For reflect, edge and wrap padding of a dim of size n (pads >= 0): the index each output reads."""
    if n == 0:
        raise ShapeError(f"Pad: mode '{mode}' cannot pad an empty dim")
    i = np.arange(-begin, n + end)
    if mode == "edge":
        return np.clip(i, 0, n - 1)
    if mode == "wrap":
        return np.mod(i, n)
    period = max(2 * (n - 1), 1)  # reflect: about the first and last elements, repeatedly
    i = np.mod(i, period)
    return np.where(i < n, i, period - i)


def crop_widths(shape: tuple[int, ...], widths: list[tuple[int, int]]) -> tuple[tuple[slice, ...], list]:
    """Negative pads remove elements: the slices that do that, and the pads (all >= 0) left after them. A
    crop past the far end of a dim eats into the other side's pad, so that a dim n gets n + begin + end."""
    crop, left = [], []
    for n, (begin, end) in zip(shape, widths):
        cut_begin, cut_end = max(-begin, 0), max(-end, 0)
        crop.append(slice(cut_begin, max(n - cut_end, 0)))
        left.append((max(begin, 0) - max(cut_end - n, 0), max(end, 0) - max(cut_begin - n, 0)))
    return tuple(crop), left


@op("Pad")
def _pad(node: Node, opset: int) -> Fn:
    mode = node.attrs.get("mode", "constant")  # checked by forms.py; legacy.py makes Pad-1/2's pads inputs

    def run(x: np.ndarray, pads: np.ndarray, value: Any = None, axes: Any = None) -> np.ndarray:
        crop, widths = crop_widths(x.shape, pad_widths("Pad", x.shape, pads, axes))
        x = x[crop]
        if mode == "constant":
            fill = 0 if value is None or np.size(value) == 0 else np.asarray(value).reshape(-1)[0]
            return np.pad(x, widths, constant_values=np.asarray(fill).astype(x.dtype))
        for axis, (begin, end) in enumerate(widths):
            if begin or end:
                x = np.take(x, pad_source(x.shape[axis], begin, end, mode), axis=axis)
        return x

    return run


@op("Resize", "Upsample")
def _resize(node: Node, opset: int) -> Fn:
    spec = resize_spec(node, opset)
    return lambda x, *rest: resize(spec, x, *rest)


def topk_order(x: np.ndarray, axis: int, largest: bool) -> np.ndarray:
    """Indices that sort `x` along `axis`, largest (or smallest) first, ties in index order."""
    if not largest:
        return np.argsort(x, axis=axis, kind="stable")
    flipped = np.argsort(np.flip(x, axis), axis=axis, kind="stable")  # ties: higher original index first
    return np.flip(x.shape[axis] - 1 - flipped, axis)


def topk_axis_and_k(axis: int, k: list[int], shape: tuple[int, ...]) -> tuple[int, int]:
    """TopK's axis as an index and its k, checked alike on both paths: k is one value in [0, dim]."""
    ax = _axis("TopK", axis, len(shape))
    if len(k) != 1 or not 0 <= k[0] <= shape[ax]:
        raise ArgumentError(f"TopK: k={k} is not one value in [0, {shape[ax]}] (axis {axis} of {tuple(shape)})")
    return ax, k[0]


@op("TopK")
def _topk(node: Node, opset: int) -> Fn:
    axis, largest = node.attrs.get("axis", -1), bool(node.attrs.get("largest", 1))  # legacy.py: TopK-1's k

    def run(x: np.ndarray, k: np.ndarray) -> tuple:
        ax, count = topk_axis_and_k(axis, _ints(k), x.shape)
        index = np.take(topk_order(x, ax, largest), np.arange(count), axis=ax)
        return np.take_along_axis(x, index, axis=ax), index.astype(np.int64)

    return run


def check_dropout_inference(ratio: Any, training: Any) -> None:
    """A training_mode fed as True (forms.py declines a constant one) drops values at random unless the
    ratio is 0: refused, as the session runs inference only."""
    on = training is not None and bool(np.asarray(training).reshape(-1)[0])
    if on and (ratio is None or np.asarray(ratio).reshape(-1)[0] != 0):
        raise ArgumentError(
            "Dropout: training_mode=True with a ratio above 0 drops values at random; the session runs "
            "inference only (training_mode False, or ratio 0)"
        )


@op("Dropout")
def _dropout(node: Node, opset: int) -> Fn:
    mask = len(node.outputs) > 1 and bool(node.outputs[1])  # all True: bool from opset 10, x's type before

    def run(x: np.ndarray, ratio: Any = None, training: Any = None) -> tuple:
        check_dropout_inference(ratio, training)
        if not mask:
            return (x,)
        return x, np.ones(x.shape, bool if opset >= 10 else x.dtype)

    return run


SUPPORTED = frozenset(OPS) | {"Constant"}  # Constant nodes become initializers when the model is loaded
