"""Indexing ONNX ops: Gather, GatherElements, GatherND, ScatterND, ScatterElements (and Scatter), OneHot. Indices
are checked against the axis they address; scatters with repeated indices keep the last update (reduction
none) or combine them all (add, mul, max, min)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import ArgumentError, ShapeError
from ...graph.ir import Node
from ..errors import UnsupportedModelError
from .record import Fn, LoadContext, axis_index, check_indices, itemsize, op, to_host, torch


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
def _nd_index(op: str, data_shape: tuple[int, ...], indices: np.ndarray, batch_dims: int) -> tuple:
    """The index tuple for data[...] that picks what GatherND / ScatterND address: the batch dims' positions
    broadcast against the index columns (negative ones wrapped); ArgumentError naming the op when out of range."""
    depth = indices.shape[-1]
    if batch_dims + depth > len(data_shape):
        raise ShapeError(f"{op}: index depth {depth} after {batch_dims} batch dims exceeds data rank {len(data_shape)}")
    if tuple(indices.shape[:batch_dims]) != tuple(data_shape[:batch_dims]):
        raise ShapeError(f"{op}: batch dims of indices {indices.shape} and data {tuple(data_shape)} differ")
    columns = []
    for k in range(depth):
        dim = data_shape[batch_dims + k]
        column = indices[..., k]
        check_indices(op, column, dim, batch_dims + k, data_shape)
        columns.append(np.where(column < 0, column + dim, column))
    lead = indices.shape[:-1]
    batch = [
        np.arange(n).reshape((1,) * b + (n,) + (1,) * (len(lead) - b - 1)) for b, n in enumerate(lead[:batch_dims])
    ]
    return (*batch, *columns)


def gather_nd(node: Node, opset: int) -> Fn:
    batch_dims = int(node.attrs.get("batch_dims", 0))
    return lambda data, indices: data[_nd_index("GatherND", data.shape, np.asarray(indices), batch_dims)]


def gather_nd_torch(node: Node, opset: int) -> Fn:
    batch_dims = int(node.attrs.get("batch_dims", 0))

    def run(data: Any, indices: Any) -> Any:
        index = _nd_index("GatherND", tuple(data.shape), to_host(indices), batch_dims)
        return data[tuple(torch.as_tensor(i, device=data.device) for i in index)]

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


def tensor_scatter(node: Node, opset: int) -> Fn:
    """A key/value cache update: `update` written into `past` along `axis` from each batch's write index
    (wrapping around with mode 'circular')."""
    circular, axis = node.attrs.get("mode", "linear") == "circular", int(node.attrs.get("axis", -2))

    def run(past: np.ndarray, update: np.ndarray, write: Any = None) -> np.ndarray:
        ax = axis_index("TensorScatter", axis, past.ndim)
        if ax == 0 or update.shape[:ax] != past.shape[:ax] or update.shape[ax] > past.shape[ax]:
            raise ShapeError(f"TensorScatter: update {update.shape} does not fit cache {past.shape} on axis {axis}")
        starts = np.zeros(past.shape[0], np.int64) if write is None else np.asarray(write, np.int64).reshape(-1)
        out = past.copy()
        for b, start in enumerate(starts):
            rows = start + np.arange(update.shape[ax])
            rows = rows % past.shape[ax] if circular else rows
            index = [slice(None)] * (past.ndim - 1)
            index[ax - 1] = rows  # one array index: its dim stays in place
            out[b][tuple(index)] = update[b]
        return out

    return run


op("TensorScatter", tensor_scatter, host_inputs=(2,))
