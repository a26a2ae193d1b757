"""Pooling: MaxPool (with its Indices output), AveragePool (count_include_pad), LpPool, and the global pools,
over 1 to 3 (or more) spatial dims, with strides, dilations, pads, auto_pad and ceil_mode; MaxUnpool.

Both paths pad the input (with the lowest value for max, 0 for sums), view its windows as a strided array
(N, C, *out, *kernel) and reduce over the kernel dims; an average divides by the count of cells that are
input (or explicit padding, with count_include_pad) in each window."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from ...errors import ShapeError
from ...graph.ir import Node
from .record import Fn, check_indices, ints, itemsize, op, to_host, torch
from .window import Window, check_auto_pad, numpy_windows, torch_pad_widths, torch_windows, window


def pool_window(node: Node, x: Any) -> Window:
    if len(x.shape) < 3:
        raise ShapeError(f"{node.op}: input of shape {tuple(x.shape)} has no spatial dims (N, C, D1, ...)")
    kernel = tuple(node.attrs.get("kernel_shape") or ())
    return window(node, tuple(x.shape[2:]), kernel, bool(node.attrs.get("ceil_mode", 0)))


def _lowest(dtype: np.dtype) -> Any:
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


def _kernel_axes(win: Window) -> tuple[int, ...]:
    start = 2 + len(win.out)
    return tuple(range(start, start + len(win.kernel)))


def _counts(spatial: tuple[int, ...], win: Window, include_pad: bool) -> np.ndarray:
    """How many cells of each window an average divides by: input cells, plus explicit pads with
    count_include_pad (never ceil_mode's extra cells). Shape (*out)."""
    inside = np.pad(np.ones(spatial, np.float64), list(zip(win.begin, win.end)), constant_values=float(include_pad))
    inside = np.pad(inside, [(0, x) for x in win.extra])
    view = numpy_windows(inside[None, None], win)[0, 0]
    return view.sum(axis=tuple(range(len(win.out), 2 * len(win.out))))


def _indices(arg: np.ndarray, x_shape: tuple[int, ...], win: Window, column_major: bool) -> np.ndarray:
    """MaxPool's Indices: the flat index (over N, C and the spatial dims, pads not counted) of each maximum."""
    spatial = x_shape[2:]
    taps = np.unravel_index(arg, win.kernel)
    flat = np.zeros(arg.shape, np.int64)
    scale = 1
    order = range(len(spatial)) if column_major else reversed(range(len(spatial)))
    for d in order:
        positions = np.arange(win.out[d]).reshape((-1,) + (1,) * (len(spatial) - 1 - d)) * win.strides[d]
        coordinate = positions + taps[d] * win.dilations[d] - win.begin[d]
        flat += coordinate * scale
        scale *= spatial[d]
    planes = np.arange(x_shape[0] * x_shape[1]).reshape(x_shape[0], x_shape[1], *(1,) * len(spatial))
    return flat + planes * math.prod(spatial)


def _max_over_taps(view: np.ndarray, win: Window) -> np.ndarray:
    """The windows' maxima as one np.maximum per kernel tap over (N, C, *out) slices: NumPy reduces a strided
    window view over several small axes slowly (ResNet-50's 3x3 stride-2 pool took 22 ms at batch 1, this ~1)."""
    out = None
    for tap in itertools.product(*(range(k) for k in win.kernel)):
        cells = view[(Ellipsis, *tap)]
        if out is None:
            out = cells.copy()
        else:
            np.maximum(out, cells, out=out)
    return out


def max_pool(node: Node, opset: int) -> Fn:
    column_major = bool(node.attrs.get("storage_order", 0))
    want_indices = len(node.outputs) > 1 and bool(node.outputs[1])

    def run(x: np.ndarray) -> tuple:
        win = pool_window(node, x)
        padded = np.pad(x, [(0, 0), (0, 0), *win.widths()], constant_values=_lowest(x.dtype))
        view = numpy_windows(padded, win)
        if not want_indices:
            return (_max_over_taps(view, win),)
        flat = view.reshape(*view.shape[: 2 + len(win.out)], -1)
        arg = flat.argmax(axis=-1)
        values = np.take_along_axis(flat, arg[..., None], axis=-1)[..., 0]
        return values, _indices(arg, x.shape, win, column_major)

    return run


def max_pool_torch(node: Node, opset: int) -> Fn:
    column_major = bool(node.attrs.get("storage_order", 0))
    want_indices = len(node.outputs) > 1 and bool(node.outputs[1])

    def run(x: Any) -> tuple:
        win = pool_window(node, x)
        low = float("-inf") if x.is_floating_point() else torch.iinfo(x.dtype).min
        view = torch_windows(torch.nn.functional.pad(x, torch_pad_widths(win.widths()), value=low), win)
        if not want_indices:
            return (view.amax(dim=_kernel_axes(win)),)
        values, arg = view.reshape(*view.shape[: 2 + len(win.out)], -1).max(dim=-1)
        index = _indices(arg.cpu().numpy(), tuple(x.shape), win, column_major)
        return values, torch.from_numpy(index).to(x.device)

    return run


def average_pool(node: Node, opset: int) -> Fn:
    include_pad = bool(node.attrs.get("count_include_pad", 0))

    def run(x: np.ndarray) -> np.ndarray:
        win = pool_window(node, x)
        view = numpy_windows(np.pad(x, [(0, 0), (0, 0), *win.widths()]), win)
        total = view.sum(axis=_kernel_axes(win), dtype=np.float64 if x.dtype == np.float64 else np.float32)
        return (total / _counts(x.shape[2:], win, include_pad)).astype(x.dtype)

    return run


def average_pool_torch(node: Node, opset: int) -> Fn:
    include_pad = bool(node.attrs.get("count_include_pad", 0))

    def run(x: Any) -> Any:
        win = pool_window(node, x)
        view = torch_windows(torch.nn.functional.pad(x, torch_pad_widths(win.widths())), win)
        counts = torch.from_numpy(_counts(tuple(x.shape[2:]), win, include_pad)).to(x.device, torch.float32)
        return (view.float().sum(dim=_kernel_axes(win)) / counts).to(x.dtype)

    return run


def lp_pool(node: Node, opset: int) -> Fn:
    p = float(node.attrs.get("p", 2))

    def run(x: np.ndarray) -> np.ndarray:
        win = pool_window(node, x)
        view = numpy_windows(np.pad(np.abs(x), [(0, 0), (0, 0), *win.widths()]), win)
        return (np.sum(view**p, axis=_kernel_axes(win)) ** (1 / p)).astype(x.dtype)

    return run


def lp_pool_torch(node: Node, opset: int) -> Fn:
    p = float(node.attrs.get("p", 2))

    def run(x: Any) -> Any:
        win = pool_window(node, x)
        view = torch_windows(torch.nn.functional.pad(x.abs(), torch_pad_widths(win.widths())), win)
        return (view**p).sum(dim=_kernel_axes(win)) ** (1 / p)

    return run


op("MaxPool", max_pool, max_pool_torch, tuple_output=True, check=check_auto_pad)
op("AveragePool", average_pool, average_pool_torch, check=check_auto_pad)
op("LpPool", lp_pool, lp_pool_torch, check=check_auto_pad)


# -- global pools -----------------------------------------------------------------------------------------------
def _spatial(x: Any) -> tuple[int, ...]:
    if len(x.shape) < 3:
        raise ShapeError(f"global pooling: input of shape {tuple(x.shape)} has no spatial dims (N, C, D1, ...)")
    return tuple(range(2, len(x.shape)))


op("GlobalAveragePool", lambda node, opset: lambda x: x.mean(axis=_spatial(x), keepdims=True).astype(x.dtype),
   lambda node, opset: lambda x: x.mean(dim=_spatial(x), keepdim=True))  # fmt: skip
op("GlobalMaxPool", lambda node, opset: lambda x: x.max(axis=_spatial(x), keepdims=True),
   lambda node, opset: lambda x: x.amax(dim=_spatial(x), keepdim=True))  # fmt: skip


def global_lp_pool(node: Node, opset: int) -> Fn:
    p = float(node.attrs.get("p", 2))
    return lambda x: (np.sum(np.abs(x) ** p, axis=_spatial(x), keepdims=True) ** (1 / p)).astype(x.dtype)


def global_lp_pool_torch(node: Node, opset: int) -> Fn:
    p = float(node.attrs.get("p", 2))
    return lambda x: (x.abs() ** p).sum(dim=_spatial(x), keepdim=True) ** (1 / p)


op("GlobalLpPool", global_lp_pool, global_lp_pool_torch)


# -- MaxUnpool -------------------------------------------------------------------------------------------------
def unpool_shapes(node: Node, shape: tuple, indices_shape: tuple, output_shape: Any) -> tuple[list[int], list[int]]:
    """The shape MaxPool's window inverts to ((in - 1) * stride - pad_begin - pad_end + kernel), which the
    indices address, and the output's shape (output_shape if given, else that one)."""
    if len(shape) < 3 or tuple(indices_shape) != tuple(shape):
        raise ShapeError(f"MaxUnpool: X {tuple(shape)} needs spatial dims and indices of its shape, got "
                         f"{tuple(indices_shape)}")  # fmt: skip
    kernel = list(node.attrs["kernel_shape"])
    n = len(kernel)
    strides = list(node.attrs.get("strides") or [1] * n)
    pads = list(node.attrs.get("pads") or [0] * (2 * n))
    spatial = [(i - 1) * s - b - e + k for i, s, b, e, k in zip(shape[2:], strides, pads[:n], pads[n:], kernel)]
    inverted = [*shape[:2], *spatial]
    out = inverted if output_shape is None else ints(output_shape)
    if len(out) != len(shape) or out[:2] != inverted[:2] or any(o < i for o, i in zip(out, inverted)):
        raise ShapeError(f"MaxUnpool: output_shape {out} must be (N, C, ...) and at least {inverted}")
    return inverted, out


def unpool_targets(node: Node, x_shape: tuple, indices: Any, output_shape: Any) -> tuple[np.ndarray, list[int]]:
    """Where each value of X goes in the flattened output: MaxPool's indices address the tensor it pooled,
    whose shape output_shape gives back (as onnxruntime and PyTorch read them; the spec's reference reads them
    in the inverted shape and keeps their coordinates, which differs where the two shapes differ)."""
    _, out = unpool_shapes(node, x_shape, indices.shape, output_shape)
    flat = np.asarray(indices).reshape(-1).astype(np.int64)
    check_indices("MaxUnpool", flat, math.prod(out), 0, tuple(out))
    return flat, out


def max_unpool(node: Node, opset: int) -> Fn:
    """Zeros, with each value of X put where its index (MaxPool's, into the flattened input) says."""

    def run(x: np.ndarray, indices: np.ndarray, output_shape: Any = None) -> np.ndarray:
        targets, shape = unpool_targets(node, x.shape, indices, output_shape)
        out = np.zeros(math.prod(shape), x.dtype)
        out[targets] = x.reshape(-1)
        return out.reshape(shape)

    return run


def max_unpool_torch(node: Node, opset: int) -> Fn:
    def run(x: Any, indices: Any, output_shape: Any = None) -> Any:
        targets, shape = unpool_targets(node, tuple(x.shape), to_host(indices), output_shape)
        out = x.new_zeros(math.prod(shape))
        return out.scatter_(0, torch.from_numpy(targets).to(x.device), x.reshape(-1)).reshape(shape)

    return run


op("MaxUnpool", max_unpool, max_unpool_torch, shape_inputs=(2,), host_inputs=(1,),
   size=lambda node, args, opset: (tuple(unpool_shapes(node, tuple(args[0].shape), tuple(args[1].shape),
                                                       (*args, None)[2])[1]), itemsize(args[0])))  # fmt: skip
