"""Indexing ONNX ops: Gather, GatherElements, GatherND, ScatterND, ScatterElements (and Scatter), OneHot,
Compress, NonZero, Unique, ReverseSequence, TensorScatter. Indices are checked against the axis they address;
scatters with repeated indices keep the last update (reduction none) or combine them all (add, mul, max,
min)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import ArgumentError, ShapeError
from ...graph.ir import Node
from ..errors import UnsupportedModelError
from .record import Fn, LoadContext, axis_index, check_indices, host_readable, itemsize, op, to_host, torch


def gather(node: Node, opset: int) -> Fn:
    axis = node.attrs.get("axis", 0)

    def run(x: np.ndarray, indices: np.ndarray) -> np.ndarray:
        ax = axis_index("Gather", axis, x.ndim)
        check_indices("Gather", indices, x.shape[ax], axis, x.shape)
        return np.take(x, indices, axis=ax)

    return run


def gather_torch(node: Node, opset: int) -> Fn:
    axis = node.attrs.get("axis", 0)

    def run(x: Any, indices: Any) -> Any:
        ax = axis_index("Gather", axis, x.dim())
        idx = indices.long()
        idx = torch.where(idx < 0, idx + x.shape[ax], idx)
        flat = torch.index_select(x, ax, idx.reshape(-1))
        return flat.reshape(*x.shape[:ax], *indices.shape, *x.shape[ax + 1 :])

    return run


def gather_size(node: Node, args: list, opset: int) -> tuple[tuple[int, ...], int]:
    x, indices = args
    ax = node.attrs.get("axis", 0) % max(len(x.shape), 1)
    return (*x.shape[:ax], *indices.shape, *x.shape[ax + 1 :]), itemsize(x)


op("Gather", gather, gather_torch, size=gather_size)


def gather_elements(node: Node, opset: int) -> Fn:
    axis = node.attrs.get("axis", 0)

    def run(x: np.ndarray, indices: np.ndarray) -> np.ndarray:
        ax = axis_index("GatherElements", axis, x.ndim)
        dim = x.shape[ax]
        check_indices("GatherElements", indices, dim, axis, x.shape)
        return np.take_along_axis(x, np.where(indices < 0, indices + dim, indices), axis=ax)

    return run


def gather_elements_torch(node: Node, opset: int) -> Fn:
    axis = node.attrs.get("axis", 0)

    def run(x: Any, indices: Any) -> Any:
        ax = axis_index("GatherElements", axis, x.dim())
        idx = indices.long()
        return torch.gather(x, ax, torch.where(idx < 0, idx + x.shape[ax], idx))

    return run


op("GatherElements", gather_elements, gather_elements_torch)


# -- GatherND -------------------------------------------------------------------------------------------------------
def _nd_index(op: str, data_shape: tuple[int, ...], indices: Any, batch_dims: int, arange: Fn = np.arange,
              check: bool = True) -> tuple:  # fmt: skip
    """The index tuple for data[...] that picks what GatherND / ScatterND address: the batch dims' positions
    (`arange`: of the indices' kind and device) broadcast against the index columns, negative ones wrapped.
    ArgumentError naming the op when out of range (with `check`: it reads the indices on the host)."""
    depth = indices.shape[-1]
    if batch_dims + depth > len(data_shape):
        raise ShapeError(f"{op}: index depth {depth} after {batch_dims} batch dims exceeds data rank {len(data_shape)}")
    if tuple(indices.shape[:batch_dims]) != tuple(data_shape[:batch_dims]):
        raise ShapeError(f"{op}: batch dims of indices {tuple(indices.shape)} and data {tuple(data_shape)} differ")
    columns = []
    for k in range(depth):
        dim = data_shape[batch_dims + k]
        column = indices[..., k]
        if check:
            check_indices(op, column, dim, batch_dims + k, data_shape)
        columns.append(column + dim * (column < 0))
    lead = tuple(indices.shape[:-1])
    batch = [arange(n).reshape((1,) * b + (n,) + (1,) * (len(lead) - b - 1)) for b, n in enumerate(lead[:batch_dims])]
    return (*batch, *columns)


def gather_nd(node: Node, opset: int) -> Fn:
    batch_dims = int(node.attrs.get("batch_dims", 0))
    return lambda data, indices: data[_nd_index("GatherND", data.shape, np.asarray(indices), batch_dims)]


def gather_nd_torch(node: Node, opset: int) -> Fn:
    """GatherND on the indices' device, without a copy to the host: HF's padding-mask indexing sits inside the
    captured CUDA graph. Indices are range-checked on the host except while a graph is being captured (a
    replay, like PyTorch's indexing, stops out-of-range indices with a device-side assert)."""
    batch_dims = int(node.attrs.get("batch_dims", 0))

    def run(data: Any, indices: Any) -> Any:
        idx = indices.long()
        arange = lambda n: torch.arange(n, device=idx.device)  # noqa: E731
        return data[_nd_index("GatherND", tuple(data.shape), idx, batch_dims, arange, host_readable(idx))]

    return run


def gather_nd_size(node: Node, args: list, opset: int) -> tuple[tuple[int, ...], int]:
    data, indices = args
    rest = tuple(data.shape[int(node.attrs.get("batch_dims", 0)) + indices.shape[-1] :]) if indices.shape else ()
    return (*indices.shape[:-1], *rest), itemsize(data)


op("GatherND", gather_nd, gather_nd_torch, size=gather_nd_size)


# -- ScatterND and ScatterElements -------------------------------------------------------------------------------------
REDUCTIONS = ("none", "add", "mul", "max", "min")


def check_reduction(node: Node, ctx: LoadContext) -> None:
    value = node.attrs.get("reduction", "none")
    if value not in REDUCTIONS:
        raise UnsupportedModelError(
            f"{node.describe()}: attribute reduction={value!r} is not supported; supported: {', '.join(REDUCTIONS)}"
        )


_NUMPY_REDUCE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter_numpy(data: np.ndarray, index: tuple, updates: np.ndarray, reduction: str) -> np.ndarray:
    out = data.copy()
    if reduction == "none":
        out[index] = updates  # repeated indices: the last update wins, as in onnxruntime
    else:
        _NUMPY_REDUCE[reduction].at(out, index, updates)
    return out


def _scatter_torch(data: Any, index: tuple, updates: Any, reduction: str) -> Any:
    index = tuple(torch.as_tensor(i, device=data.device) for i in index)
    out = data.clone()
    if reduction == "none":
        out[index] = updates
        return out
    flat = out.reshape(-1)
    positions = torch.zeros((), dtype=torch.long, device=data.device)
    for i, stride in zip(index, out.stride()):
        positions = positions + i * stride
    for dim in range(len(index), out.dim()):  # the dims a partial (ScatterND) index leaves whole
        steps = torch.arange(out.shape[dim], device=data.device) * out.stride(dim)
        positions = positions.unsqueeze(-1) + steps
    positions = positions.expand(updates.shape).reshape(-1)
    mode = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}[reduction]
    flat.scatter_reduce_(0, positions, updates.reshape(-1), mode, include_self=True)
    return out


def scatter_nd(node: Node, opset: int) -> Fn:
    reduction = node.attrs.get("reduction", "none")

    def run(data: np.ndarray, indices: np.ndarray, updates: np.ndarray) -> np.ndarray:
        return _scatter_numpy(data, _nd_index("ScatterND", data.shape, indices, 0), updates, reduction)

    return run


def scatter_nd_torch(node: Node, opset: int) -> Fn:
    reduction = node.attrs.get("reduction", "none")

    def run(data: Any, indices: Any, updates: Any) -> Any:
        return _scatter_torch(data, _nd_index("ScatterND", tuple(data.shape), to_host(indices), 0), updates, reduction)

    return run


op("ScatterND", scatter_nd, scatter_nd_torch, host_inputs=(1,), check=check_reduction)


def _elements_index(op: str, data_shape: tuple[int, ...], indices: np.ndarray, axis: int) -> tuple:
    """data[...] index of ScatterElements: `indices` along `axis`, every other dim its own position."""
    ax = axis_index(op, axis, len(data_shape))
    check_indices(op, indices, data_shape[ax], axis, data_shape)
    index = list(np.indices(indices.shape, sparse=True))
    index[ax] = np.where(indices < 0, indices + data_shape[ax], indices)
    return tuple(index)


def scatter_elements(node: Node, opset: int) -> Fn:
    axis, reduction = node.attrs.get("axis", 0), node.attrs.get("reduction", "none")

    def run(data: np.ndarray, indices: np.ndarray, updates: np.ndarray) -> np.ndarray:
        return _scatter_numpy(data, _elements_index(node.op, data.shape, indices, axis), updates, reduction)

    return run


def scatter_elements_torch(node: Node, opset: int) -> Fn:
    axis, reduction = node.attrs.get("axis", 0), node.attrs.get("reduction", "none")

    def run(data: Any, indices: Any, updates: Any) -> Any:
        index = _elements_index(node.op, tuple(data.shape), to_host(indices), axis)
        return _scatter_torch(data, index, updates, reduction)

    return run


op("ScatterElements", scatter_elements, scatter_elements_torch, host_inputs=(1,), check=check_reduction)
op("Scatter", scatter_elements, scatter_elements_torch, host_inputs=(1,))  # Scatter-9 and -11: ScatterElements


# -- OneHot ------------------------------------------------------------------------------------------------------------
def one_hot_args(indices: np.ndarray, depth: Any, axis: int) -> tuple[int, int, np.ndarray]:
    """OneHot's axis (as an index into the output), depth, and the indices with negative ones wrapped (those
    still outside [0, depth) select no position)."""
    size = int(np.asarray(to_host(depth)).reshape(-1)[0])
    if size < 1:
        raise ArgumentError(f"OneHot: depth {size} is not positive")
    ax = axis_index("OneHot", axis, indices.ndim + 1)
    return ax, size, np.where(indices < 0, indices + size, indices)


def one_hot(node: Node, opset: int) -> Fn:
    axis = node.attrs.get("axis", -1)

    def run(indices: np.ndarray, depth: np.ndarray, values: np.ndarray) -> np.ndarray:
        ax, size, wrapped = one_hot_args(np.asarray(indices).astype(np.int64), depth, axis)
        positions = np.arange(size).reshape((size,) + (1,) * (indices.ndim - ax))
        hot = np.expand_dims(wrapped, ax) == positions
        return np.where(hot, values[1], values[0]).astype(values.dtype)

    return run


def one_hot_torch(node: Node, opset: int) -> Fn:
    axis = node.attrs.get("axis", -1)

    def run(indices: Any, depth: Any, values: Any) -> Any:
        host = to_host(indices).astype(np.int64)
        ax, size, wrapped = one_hot_args(host, depth, axis)
        positions = np.arange(size).reshape((size,) + (1,) * (host.ndim - ax))
        hot = torch.from_numpy(np.expand_dims(wrapped, ax) == positions).to(values.device)
        return torch.where(hot, values[1], values[0])

    return run


def one_hot_size(node: Node, args: list, opset: int) -> tuple[tuple[int, ...], int]:
    indices, depth, values = args
    shape = list(indices.shape)
    shape.insert(node.attrs.get("axis", -1) % (len(shape) + 1), int(np.asarray(to_host(depth)).reshape(-1)[0]))
    return tuple(shape), itemsize(values)


op("OneHot", one_hot, one_hot_torch, shape_inputs=(1,), host_inputs=(0,), size=one_hot_size)


# -- Compress and NonZero -----------------------------------------------------------------------------------
def _kept(condition: Any, length: int) -> np.ndarray:
    """The indices Compress keeps: where the condition is True (a condition shorter than the axis drops
    the rest; a longer one may hold only False past the end)."""
    cond = np.asarray(to_host(condition)).reshape(-1).astype(bool)
    if cond[length:].any():
        raise ArgumentError(f"Compress: condition selects index {length + int(np.argmax(cond[length:]))} past "
                            f"the end of an axis of length {length}")  # fmt: skip
    return np.flatnonzero(cond[:length])


def compress(node: Node, opset: int) -> Fn:
    axis = node.attrs.get("axis")

    def run(x: np.ndarray, condition: np.ndarray) -> np.ndarray:
        if axis is None:
            return x.reshape(-1)[_kept(condition, x.size)]
        ax = axis_index("Compress", axis, x.ndim)
        return np.take(x, _kept(condition, x.shape[ax]), axis=ax)

    return run


def compress_torch(node: Node, opset: int) -> Fn:
    axis = node.attrs.get("axis")

    def run(x: Any, condition: Any) -> Any:
        flat = x.reshape(-1) if axis is None else x
        ax = 0 if axis is None else axis_index("Compress", axis, x.dim())
        kept = torch.from_numpy(_kept(condition, flat.shape[ax])).to(x.device)
        return torch.index_select(flat, ax, kept)

    return run


op("Compress", compress, compress_torch, shape_inputs=(1,))
op("NonZero", lambda node, opset: lambda x: np.array(np.nonzero(x), np.int64).reshape(x.ndim, -1),
   lambda node, opset: lambda x: torch.nonzero(x).T.contiguous(), shape_inputs=(0,))  # fmt: skip


# -- Unique -------------------------------------------------------------------------------------------------
def unique(node: Node, opset: int) -> Fn:
    """Unique values (or slices along `axis`), sorted or in order of first occurrence, with the index of
    each one's first occurrence, each input element's index in the output, and the counts."""
    axis, keep_sorted = node.attrs.get("axis"), bool(node.attrs.get("sorted", 1))

    def run(x: np.ndarray) -> tuple:
        ax = None if axis is None else axis_index("Unique", axis, x.ndim)
        y, first, inverse, counts = np.unique(x, True, True, True, axis=ax)
        inverse = inverse.reshape(-1)
        if not keep_sorted:
            order = np.argsort(first, kind="stable")
            rank = np.empty_like(order)
            rank[order] = np.arange(order.size)
            y, first, inverse, counts = np.take(y, order, axis=ax or 0), first[order], rank[inverse], counts[order]
        return y, *(np.asarray(a, np.int64) for a in (first, inverse, counts))

    return run


op("Unique", unique, shape_inputs=(0,), tuple_output=True)  # the GPU path: on the host


# -- ReverseSequence ----------------------------------------------------------------------------------------
def reverse_index(shape: tuple[int, ...], lengths: np.ndarray, batch_axis: int, time_axis: int) -> np.ndarray:
    """For every element, where along the time axis ReverseSequence reads it: the first lengths[b] steps of
    batch b reversed, the rest in place."""
    if batch_axis == time_axis or {batch_axis, time_axis} - {0, 1} or len(shape) < 2:
        raise ShapeError(f"ReverseSequence: batch_axis {batch_axis} and time_axis {time_axis} must be 0 and 1 "
                         f"(in some order) of an input of rank >= 2, got shape {tuple(shape)}")  # fmt: skip
    steps, batch = shape[time_axis], shape[batch_axis]
    lengths = lengths.reshape(-1).astype(np.int64)
    if lengths.shape != (batch,) or (lengths < 0).any() or (lengths > steps).any():
        raise ArgumentError(f"ReverseSequence: sequence_lens must hold {batch} values in [0, {steps}], got {lengths}")
    t = np.arange(steps)[:, None] if time_axis == 0 else np.arange(steps)[None, :]
    n = lengths[None, :] if time_axis == 0 else lengths[:, None]
    index = np.where(t < n, n - 1 - t, t)
    return index.reshape(index.shape + (1,) * (len(shape) - 2))


def reverse_sequence(node: Node, opset: int) -> Fn:
    batch_axis, time_axis = node.attrs.get("batch_axis", 1), node.attrs.get("time_axis", 0)

    def run(x: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        index = reverse_index(x.shape, lengths, batch_axis, time_axis)
        return np.take_along_axis(x, np.broadcast_to(index, x.shape), axis=time_axis)

    return run


def reverse_sequence_torch(node: Node, opset: int) -> Fn:
    batch_axis, time_axis = node.attrs.get("batch_axis", 1), node.attrs.get("time_axis", 0)

    def run(x: Any, lengths: Any) -> Any:
        index = reverse_index(tuple(x.shape), to_host(lengths), batch_axis, time_axis)
        return torch.gather(x, time_axis, torch.from_numpy(index).to(x.device).expand(x.shape))

    return run


op("ReverseSequence", reverse_sequence, reverse_sequence_torch, host_inputs=(1,))


# -- TensorScatter ------------------------------------------------------------------------------------------
def check_tensor_scatter(node: Node, ctx: LoadContext) -> None:
    if node.attrs.get("mode", "linear") not in ("linear", "circular"):
        mode = node.attrs["mode"]
        raise UnsupportedModelError(f"{node.describe()}: mode must be 'linear' or 'circular', got {mode!r}")


def scatter_positions(node: Node, past: tuple, update: tuple, write: Any) -> tuple[int, np.ndarray]:
    """TensorScatter's axis and, for every update element, the cache position along it it is written to:
    write_indices[batch] + its own position (modulo the cache length in circular mode)."""
    axis = node.attrs.get("axis", -2)
    ax = axis_index("TensorScatter", axis, len(past))
    if ax == 0 or len(update) != len(past) or any(u != p for i, (u, p) in enumerate(zip(update, past)) if i != ax):
        raise ShapeError(f"TensorScatter: update {tuple(update)} must match past_cache {tuple(past)} but along "
                         f"axis {axis} (not the batch axis 0)")  # fmt: skip
    length, steps = past[ax], update[ax]
    start = np.zeros(past[0], np.int64) if write is None else np.asarray(to_host(write)).reshape(-1).astype(np.int64)
    positions = start[:, None] + np.arange(steps)[None, :]
    if node.attrs.get("mode", "linear") == "circular":
        positions = positions % length if length else positions
    elif steps and ((start < 0).any() or (positions[:, -1] >= length).any()):
        raise ArgumentError(f"TensorScatter: write_indices {start} + {steps} updates run past the cache length "
                            f"{length} (mode 'linear')")  # fmt: skip
    shape = [1] * len(past)
    shape[0], shape[ax] = past[0], steps
    return ax, positions.reshape(shape)


def tensor_scatter(node: Node, opset: int) -> Fn:
    def run(past: np.ndarray, update: np.ndarray, write: np.ndarray | None = None) -> np.ndarray:
        ax, positions = scatter_positions(node, past.shape, update.shape, write)
        present = past.copy()
        np.put_along_axis(present, np.broadcast_to(positions, update.shape), update, axis=ax)
        return present

    return run


def tensor_scatter_torch(node: Node, opset: int) -> Fn:
    def run(past: Any, update: Any, write: Any = None) -> Any:
        ax, positions = scatter_positions(node, tuple(past.shape), tuple(update.shape), write)
        index = torch.from_numpy(positions).to(past.device).expand(update.shape)
        return past.scatter(ax, index, update)

    return run


op("TensorScatter", tensor_scatter, tensor_scatter_torch, host_inputs=(2,), check=check_tensor_scatter)
