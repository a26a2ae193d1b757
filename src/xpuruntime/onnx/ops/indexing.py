"""Indexing ONNX ops: Gather and GatherElements (indices checked against the gathered axis), Compress,
NonZero, Unique, ReverseSequence, TensorScatter."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import ArgumentError, ShapeError
from ...graph.ir import Node
from ..errors import UnsupportedModelError
from .record import Fn, LoadContext, axis_index, check_indices, on_host, op, to_host, torch


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


op("Gather", gather, gather_torch)


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


op("Unique", unique, on_host(unique), shape_inputs=(0,), tuple_output=True)


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
