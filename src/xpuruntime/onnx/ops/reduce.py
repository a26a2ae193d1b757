"""Reductions and scans: Reduce* (ReduceSum through the selector's sum kernels), ArgMax / ArgMin, CumSum /
CumProd, TopK. Reduce axes are an attribute before opset 18 (13 for ReduceSum), an input from then on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ...errors import ArgumentError
from ...graph.ir import GraphError, Node
from .record import Builder, Fn, LoadContext, Lowered, axis_index, ints, is_float, op, torch

AXES_AS_INPUT_FROM = {"ReduceSum": 13}  # the others take axes as an input from opset 18


def reduce_axes(node: Node, opset: int, ndim: int, axes: Any) -> tuple[int, ...] | None:
    """The sorted axes a Reduce node reduces for an input of rank `ndim`; None: none (noop_with_empty_axes)."""
    raw = ints(axes) if opset >= AXES_AS_INPUT_FROM.get(node.op, 18) else list(node.attrs.get("axes") or ())
    if not raw:
        if node.attrs.get("noop_with_empty_axes", 0):
            return None
        raw = list(range(ndim))
    return tuple(sorted(axis_index(node.op, a, ndim) for a in raw))


def _reduce(fn: Callable, empty: Callable[[np.dtype], Any] | None) -> Builder:
    def build(node: Node, opset: int) -> Fn:
        keepdims = bool(node.attrs.get("keepdims", 1))

        def run(x: np.ndarray, axes: np.ndarray | None = None) -> np.ndarray:
            ax = reduce_axes(node, opset, x.ndim, axes)
            if ax is None:
                return x
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


def _extreme_torch(dtype: Any, low: bool) -> Any:
    """The identity of max (low=True) or min over a torch dtype."""
    if dtype == torch.bool:
        return not low
    if dtype.is_floating_point:
        return float("-inf") if low else float("inf")
    return torch.iinfo(dtype).min if low else torch.iinfo(dtype).max


def _reduce_torch(fn: Callable | None) -> Builder:
    """A torch reduction `fn(x, dim, keepdim)`; None: ReduceMax / ReduceMin (whose empty result is the
    dtype's lowest / highest value)."""

    def build(node: Node, opset: int) -> Fn:
        keepdims = bool(node.attrs.get("keepdims", 1))

        def run(x: Any, axes: Any = None) -> Any:
            dims = reduce_axes(node, opset, x.dim(), axes)
            if dims is None:
                return x
            if fn is not None:
                return fn(x, dims, keepdims).to(x.dtype)
            if any(x.shape[d] == 0 for d in dims):
                shape = [1 if i in dims else n for i, n in enumerate(x.shape) if keepdims or i not in dims]
                fill = _extreme_torch(x.dtype, low=node.op == "ReduceMax")
                return torch.full(shape, fill, dtype=x.dtype, device=x.device)
            return (torch.amax if node.op == "ReduceMax" else torch.amin)(x, dim=dims, keepdim=keepdims)

        return run

    return build


def _prod_torch(x: Any, dims: tuple, keepdim: bool) -> Any:
    for d in reversed(dims):  # torch.prod takes one dim at a time
        x = torch.prod(x, dim=d, keepdim=keepdim)
    return x


def lower_reduce_sum(node: Node, args: list, opset: int) -> Lowered | None:
    x = args[0]
    axes = args[1] if len(args) > 1 else None
    if opset < 13 or not is_float(x) or x.ndim == 0:
        return None
    raw = ints(axes)  # a host array (static)
    if not raw and node.attrs.get("noop_with_empty_axes", 0):
        return None
    axis = tuple(raw) if raw else None
    return "sum", (0,), {"axis": axis, "keepdims": bool(node.attrs.get("keepdims", 1))}


REDUCTIONS: dict[str, tuple[Builder, Builder]] = {
    "ReduceSum": (_reduce(np.sum, None), _reduce_torch(lambda x, d, k: torch.sum(x, dim=d, keepdim=k))),
    "ReduceMean": (_reduce(np.mean, lambda d: np.nan), _reduce_torch(lambda x, d, k: torch.mean(x, dim=d, keepdim=k))),
    "ReduceMax": (_reduce(np.max, _lowest), _reduce_torch(None)),
    "ReduceMin": (_reduce(np.min, _highest), _reduce_torch(None)),
    "ReduceProd": (_reduce(np.prod, None), _reduce_torch(_prod_torch)),
    "ReduceL1": (
        _reduce(lambda x, **k: np.sum(np.abs(x), **k), None),
        _reduce_torch(lambda x, d, k: torch.sum(x.abs(), dim=d, keepdim=k)),
    ),
    "ReduceL2": (
        _reduce(lambda x, **k: np.sqrt(np.sum(np.square(x), **k)), None),
        _reduce_torch(lambda x, d, k: torch.sqrt(torch.sum(x * x, dim=d, keepdim=k).double())),
    ),
    "ReduceSumSquare": (
        _reduce(lambda x, **k: np.sum(np.square(x), **k), None),
        _reduce_torch(lambda x, d, k: torch.sum(x * x, dim=d, keepdim=k)),
    ),
    "ReduceLogSum": (
        _reduce(lambda x, **k: np.log(np.sum(x, **k)), None),
        _reduce_torch(lambda x, d, k: torch.log(torch.sum(x, dim=d, keepdim=k).double())),
    ),
    "ReduceLogSumExp": (
        _reduce(lambda x, **k: np.log(np.sum(np.exp(x.astype(np.float64)), **k)), None),
        _reduce_torch(lambda x, d, k: torch.logsumexp(x.double(), dim=d, keepdim=k)),
    ),
}
for _name, (_numpy, _torch) in REDUCTIONS.items():
    op(_name, _numpy, _torch, shape_inputs=(1,), lower=lower_reduce_sum if _name == "ReduceSum" else None)


# -- arg reductions and scans ----------------------------------------------------------------------------------
def arg_reduce(node: Node, opset: int) -> Fn:
    axis, keepdims = node.attrs.get("axis", 0), bool(node.attrs.get("keepdims", 1))
    last = bool(node.attrs.get("select_last_index", 0))
    fn = np.argmax if node.op == "ArgMax" else np.argmin

    def run(x: np.ndarray) -> np.ndarray:
        ax = axis_index(node.op, axis, x.ndim)
        if last:
            flipped = np.flip(x, ax)
            result = x.shape[ax] - 1 - fn(flipped, axis=ax, keepdims=keepdims)
        else:
            result = fn(x, axis=ax, keepdims=keepdims)
        return np.asarray(result, np.int64)

    return run


def arg_reduce_torch(node: Node, opset: int) -> Fn:
    axis, keepdims = node.attrs.get("axis", 0), bool(node.attrs.get("keepdims", 1))
    last = bool(node.attrs.get("select_last_index", 0))

    def run(x: Any) -> Any:
        fn = torch.argmax if node.op == "ArgMax" else torch.argmin
        ax = axis_index(node.op, axis, x.dim())
        if last:
            return x.shape[ax] - 1 - fn(torch.flip(x, (ax,)), dim=ax, keepdim=keepdims)
        return fn(x, dim=ax, keepdim=keepdims)

    return run


op("ArgMax", arg_reduce, arg_reduce_torch)
op("ArgMin", arg_reduce, arg_reduce_torch)


def cumulative(node: Node, opset: int) -> Fn:
    """CumSum and CumProd along the axis input; `exclusive` starts from the identity (0 or 1), `reverse`
    runs from the end."""
    exclusive, reverse = bool(node.attrs.get("exclusive", 0)), bool(node.attrs.get("reverse", 0))
    scan, identity = (np.cumsum, 0) if node.op == "CumSum" else (np.cumprod, 1)

    def run(x: np.ndarray, axis: np.ndarray) -> np.ndarray:
        ax = axis_index(node.op, ints(axis)[0], x.ndim)
        y = np.flip(x, ax) if reverse else x
        if exclusive and y.shape[ax]:
            first = np.full_like(np.take(y, [0], axis=ax), identity)
            y = np.concatenate([first, np.take(y, range(y.shape[ax] - 1), axis=ax)], axis=ax)
        out = scan(y, axis=ax, dtype=x.dtype)
        return np.flip(out, ax) if reverse else out

    return run


def cumulative_torch(node: Node, opset: int) -> Fn:
    exclusive, reverse = bool(node.attrs.get("exclusive", 0)), bool(node.attrs.get("reverse", 0))
    identity = 0 if node.op == "CumSum" else 1

    def run(x: Any, axis: Any) -> Any:
        scan = torch.cumsum if node.op == "CumSum" else torch.cumprod
        ax = axis_index(node.op, ints(axis)[0], x.dim())
        y = torch.flip(x, (ax,)) if reverse else x
        if exclusive and y.shape[ax]:
            y = torch.cat([torch.full_like(y.narrow(ax, 0, 1), identity), y.narrow(ax, 0, y.shape[ax] - 1)], dim=ax)
        out = scan(y, dim=ax).to(x.dtype)
        return torch.flip(out, (ax,)) if reverse else out

    return run


op("CumSum", cumulative, cumulative_torch, host_inputs=(1,))
op("CumProd", cumulative, cumulative_torch, host_inputs=(1,))


# -- TopK ------------------------------------------------------------------------------------------------------
def topk_1(node: Node, ctx: LoadContext) -> None:
    """TopK-1: k is an attribute; from opset 10 it is a 1-D input."""
    if ctx.graph.opset >= 10:
        return
    k = node.attrs.pop("k", None)
    if k is None:
        raise GraphError(f"{node.describe()}: TopK before opset 10 needs its 'k' attribute")
    node.inputs = [node.inputs[0], ctx.graph.add_constant(f"{node.name}_k", np.array([k], np.int64))]


def topk_order(x: np.ndarray, axis: int, largest: bool) -> np.ndarray:
    """Indices that sort `x` along `axis`, largest (or smallest) first, ties in index order."""
    if not largest:
        return np.argsort(x, axis=axis, kind="stable")
    flipped = np.argsort(np.flip(x, axis), axis=axis, kind="stable")  # ties: higher original index first
    return np.flip(x.shape[axis] - 1 - flipped, axis)


def topk_axis_and_k(axis: int, k: list[int], shape: tuple[int, ...]) -> tuple[int, int]:
    """TopK's axis as an index and its k, checked alike on both paths: k is one value in [0, dim]."""
    ax = axis_index("TopK", axis, len(shape))
    if len(k) != 1 or not 0 <= k[0] <= shape[ax]:
        raise ArgumentError(f"TopK: k={k} is not one value in [0, {shape[ax]}] (axis {axis} of {tuple(shape)})")
    return ax, k[0]


def topk(node: Node, opset: int) -> Fn:
    axis, largest = node.attrs.get("axis", -1), bool(node.attrs.get("largest", 1))

    def run(x: np.ndarray, k: np.ndarray) -> tuple:
        ax, count = topk_axis_and_k(axis, ints(k), x.shape)
        index = np.take(topk_order(x, ax, largest), np.arange(count), axis=ax)
        return np.take_along_axis(x, index, axis=ax), index.astype(np.int64)

    return run


def topk_torch(node: Node, opset: int) -> Fn:
    axis, largest = node.attrs.get("axis", -1), bool(node.attrs.get("largest", 1))

    def run(x: Any, k: Any) -> tuple:
        ax, count = topk_axis_and_k(axis, ints(k), tuple(x.shape))
        values, index = torch.sort(x, dim=ax, descending=largest, stable=True)  # ties: lower index first
        return values.narrow(ax, 0, count), index.narrow(ax, 0, count)

    return run


op("TopK", topk, topk_torch, shape_inputs=(1,), tuple_output=True, upgrade=topk_1)
