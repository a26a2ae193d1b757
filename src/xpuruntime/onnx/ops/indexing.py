"""Indexing ONNX ops: Gather and GatherElements (indices checked against the gathered axis)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...graph.ir import Node
from .record import Fn, axis_index, check_indices, op, torch


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
