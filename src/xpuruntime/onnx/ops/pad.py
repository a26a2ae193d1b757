"""Pad (opset 1 to 19+): constant, reflect, edge and wrap modes, negative pads (crops), optional axes.
Pad-1 and Pad-2 take pads and value as attributes; they are rewritten into Pad-11's inputs at load time."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import ShapeError
from ...graph.ir import GraphError, Node
from ..errors import UnsupportedModelError
from .record import DeviceCache, Fn, LoadContext, axis_index, ints, itemsize, op, to_host

PAD_MODES = ("constant", "reflect", "edge", "wrap")


def pad_2(node: Node, ctx: LoadContext) -> None:
    """Pad-1 (`paddings`) and Pad-2 (`pads`) with a `value` attribute -> Pad-11's pads and constant_value
    inputs (`mode` stays an attribute)."""
    graph = ctx.graph
    if graph.opset >= 11:
        return
    pads = node.attrs.pop("pads", node.attrs.pop("paddings", None))
    if pads is None:
        raise GraphError(f"{node.describe()}: Pad before opset 11 needs its 'pads' attribute")
    dtype = graph.value(node.inputs[0]).dtype or "float32"
    value = np.array(node.attrs.pop("value", 0.0), dtype)
    target = graph.add_constant(f"{node.name}_pads", np.array(list(pads), np.int64))
    node.inputs = [node.inputs[0], target, graph.add_constant(f"{node.name}_value", value)]


def check_pad(node: Node, ctx: LoadContext) -> None:
    modes = PAD_MODES if ctx.graph.opset >= 19 else PAD_MODES[:3]  # wrap: Pad-19
    mode = node.attrs.get("mode", "constant")
    if mode not in modes:
        raise UnsupportedModelError(
            f"{node.describe()}: attribute mode={mode!r} is not supported at opset {ctx.graph.opset}; "
            f"supported: {', '.join(modes)}"
        )


def pad_widths(op: str, shape: tuple[int, ...], pads: Any, axes: Any = None) -> list[tuple[int, int]]:
    """Pad-11+ `pads` ([begin..., end...] over `axes`, all axes by default) as (begin, end) per dim."""
    values, rank = ints(pads), len(shape)
    picked = [axis_index(op, a, rank) for a in ints(axes)] if axes is not None else list(range(rank))
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


def _fill(value: Any) -> np.generic:
    """Pad's constant_value as a NumPy scalar (0 when left out or empty)."""
    value = to_host(value)
    return np.int64(0) if value is None or np.size(value) == 0 else np.asarray(value).reshape(-1)[0]


def pad(node: Node, opset: int) -> Fn:
    mode = node.attrs.get("mode", "constant")

    def run(x: np.ndarray, pads: np.ndarray, value: Any = None, axes: Any = None) -> np.ndarray:
        crop, widths = crop_widths(x.shape, pad_widths("Pad", x.shape, pads, axes))
        x = x[crop]
        if mode == "constant":
            return np.pad(x, widths, constant_values=np.asarray(_fill(value)).astype(x.dtype))
        for axis, (begin, end) in enumerate(widths):
            if begin or end:
                x = np.take(x, pad_source(x.shape[axis], begin, end, mode), axis=axis)
        return x

    return run


def pad_torch(node: Node, opset: int) -> Fn:
    mode, cache = node.attrs.get("mode", "constant"), DeviceCache()

    def run(x: Any, pads: Any, value: Any = None, axes: Any = None) -> Any:
        crop, widths = crop_widths(tuple(x.shape), pad_widths("Pad", tuple(x.shape), pads, axes))
        x = x[crop]
        if mode == "constant":
            out = x.new_full([n + b + e for n, (b, e) in zip(x.shape, widths)], _fill(value).item())
            out[tuple(slice(b, b + n) for n, (b, _) in zip(x.shape, widths))] = x
            return out
        for axis, (begin, end) in enumerate(widths):
            if begin or end:
                key = (x.shape[axis], begin, end)
                (index,) = cache.get_or_move(key, lambda key=key: (pad_source(*key, mode),), x.device)
                x = x.index_select(axis, index)
        return x

    return run


def pad_size(node: Node, args: list, opset: int) -> tuple[tuple[int, ...], int]:
    x, pads, *rest = args
    axes = rest[1] if len(rest) > 1 else None
    widths = pad_widths("Pad", tuple(x.shape), pads, axes)
    return tuple(n + b + e for n, (b, e) in zip(x.shape, widths)), itemsize(x)


op("Pad", pad, pad_torch, shape_inputs=(1, 3), host_inputs=(2,), upgrade=pad_2, check=check_pad, size=pad_size)
