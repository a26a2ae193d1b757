"""Spatial sampling ONNX ops: GridSample (nearest, linear, cubic; zeros, border, reflection padding; any
number of spatial dims) and AffineGrid, the grids of which GridSample reads.

Both follow PyTorch's grid_sample / affine_grid, as the spec does: a grid holds normalized coordinates in
[-1, 1] (x first, for the last dim), mapped to pixel centers (align_corners=0) or to the corner pixels
(align_corners=1). Border and reflection padding move a linear or nearest coordinate inside the input before
it is read, and move each of the 4 taps of a cubic one (as PyTorch and onnxruntime do; the ONNX reference
also moves the cubic coordinate, which differs where it lies outside). On the GPU path the cases
F.grid_sample covers run there; the rest (1-D or 4-D and more, cubic in 3-D) run on host copies.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from ...errors import ShapeError
from ...graph.ir import Node
from ..errors import UnsupportedModelError
from .record import F, Fn, LoadContext, ints, itemsize, on_host, op

MODES = {"linear": "linear", "bilinear": "linear", "nearest": "nearest", "cubic": "cubic", "bicubic": "cubic"}
PADDINGS = ("zeros", "border", "reflection")
CUBIC_A = -0.75  # Keys' cubic convolution, as PyTorch's bicubic grid_sample


def _mode(node: Node) -> tuple[str, str, bool]:
    default = "linear" if node.attrs.get("mode") is None else node.attrs["mode"]
    return MODES.get(default, default), node.attrs.get("padding_mode", "zeros"), bool(node.attrs.get("align_corners"))


def check_grid_sample(node: Node, ctx: LoadContext) -> None:
    mode, padding, _ = _mode(node)
    if mode not in MODES.values() or padding not in PADDINGS:
        raise UnsupportedModelError(
            f"{node.describe()}: mode {node.attrs.get('mode')!r} / padding_mode {padding!r}: supported are "
            f"modes {sorted(MODES)} and padding modes {list(PADDINGS)}"
        )


# -- GridSample: coordinates -----------------------------------------------------------------------------------
def unnormalize(n: np.ndarray, length: int, align_corners: bool) -> np.ndarray:
    """A normalized coordinate in [-1, 1] as a pixel coordinate."""
    return (n + 1) / 2 * (length - 1) if align_corners else ((n + 1) * length - 1) / 2


def reflect(v: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Coordinates folded back into [lo, hi] by reflecting at the bounds as often as needed."""
    span = hi - lo
    if span <= 0:
        return np.full_like(v, lo)
    below = v < lo
    distance = np.where(below, lo - v, v - hi)
    folds = np.floor(distance / span)
    rest = distance - folds * span
    even = folds % 2 == 0
    inside = np.where(below == even, lo + rest, hi - rest)  # below and even, or above and odd: from lo
    return np.where((v < lo) | (v > hi), inside, v)


def _bounds(length: int, align_corners: bool) -> tuple[float, float]:
    return (0.0, length - 1.0) if align_corners else (-0.5, length - 0.5)


def _taps(x: np.ndarray, mode: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """The pixels one coordinate reads along its dim, with their weights."""
    if mode == "nearest":
        return [(x.astype(np.int64), np.ones_like(x))]
    base = np.floor(x)
    t = x - base
    base = base.astype(np.int64)
    if mode == "linear":
        return [(base, 1 - t), (base + 1, t)]
    a = CUBIC_A
    weights = [
        ((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
        ((a + 2) * t - (a + 3)) * t * t + 1,
        ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1,
        ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a,
    ]
    return [(base + k - 1, w) for k, w in enumerate(weights)]


def _fetch_index(i: np.ndarray, length: int, padding: str, align_corners: bool) -> tuple[np.ndarray, Any]:
    """A tap's pixel index made valid by the padding mode, and where it reads a zero (zeros padding)."""
    if padding == "zeros":
        return np.clip(i, 0, length - 1), (i >= 0) & (i < length)
    if padding == "reflection":
        i = np.trunc(reflect(i.astype(np.float64), *_bounds(length, align_corners))).astype(np.int64)
    return np.clip(i, 0, length - 1), None


def grid_sample_numpy(x: np.ndarray, grid: np.ndarray, mode: str, padding: str, align_corners: bool) -> np.ndarray:
    """GridSample on host arrays: every output pixel as the weighted sum of the input pixels its
    coordinate's taps read, gathered for all pixels at once (one gather per combination of taps)."""
    n, c, *dims = x.shape
    rank = len(dims)
    if rank < 1 or grid.ndim != rank + 2 or grid.shape[0] != n or grid.shape[-1] != rank:
        raise ShapeError(f"GridSample: grid {grid.shape} must be (N, ..., {rank}) for an input {x.shape} of rank >= 3")
    out_dims = grid.shape[1:-1]
    if x.size == 0 or grid.size == 0:
        return np.zeros((n, c, *out_dims), x.dtype)
    coords = []
    for axis, length in enumerate(dims):  # grid[..., 0] is x: the last spatial dim
        v = unnormalize(grid[..., rank - 1 - axis].astype(np.float64), length, align_corners)
        if mode == "nearest":
            v = np.rint(v)  # half to even, as PyTorch
        if mode != "cubic" and padding == "border":  # cubic pads each of its taps instead, as PyTorch
            v = np.clip(v, 0, length - 1)
        elif mode != "cubic" and padding == "reflection":
            v = reflect(v, *_bounds(length, align_corners))
        coords.append(v.reshape(n, -1))
    flat = x.reshape(n, c, -1)
    out = np.zeros((n, c, coords[0].shape[1]), np.float64)
    for combo in itertools.product(*(_taps(v, mode) for v in coords)):
        weight = np.ones_like(coords[0])
        indices = []
        for (index, w), length in zip(combo, dims):
            index, valid = _fetch_index(index, length, padding, align_corners)
            weight = weight * (w if valid is None else np.where(valid, w, 0))
            indices.append(index)
        at = np.ravel_multi_index(tuple(indices), dims)
        out += np.take_along_axis(flat, at[:, None, :], axis=2) * weight[:, None, :]
    return out.reshape(n, c, *out_dims).astype(x.dtype)


def grid_sample(node: Node, opset: int) -> Fn:
    mode, padding, align = _mode(node)
    return lambda x, grid: grid_sample_numpy(x, grid, mode, padding, align)


def grid_sample_torch(node: Node, opset: int) -> Fn:
    """F.grid_sample for 2-D and 3-D inputs (cubic in 2-D only); host copies for the rest."""
    mode, padding, align = _mode(node)
    host = on_host(grid_sample)(node, opset)

    def run(x: Any, grid: Any) -> Any:
        if x.dim() == 4 or (x.dim() == 5 and mode != "cubic"):
            name = {"linear": "bilinear", "cubic": "bicubic"}.get(mode, mode)
            return F.grid_sample(x, grid.to(x.dtype), mode=name, padding_mode=padding, align_corners=align)
        return host(x, grid)

    return run


op("GridSample", grid_sample, grid_sample_torch, check=check_grid_sample)


# -- AffineGrid --------------------------------------------------------------------------------------------------
def _affine_size(theta_shape: tuple[int, ...], size: Any) -> list[int]:
    dims = ints(size)
    rank = len(dims) - 2
    if rank not in (2, 3) or tuple(theta_shape) != (dims[0], rank, rank + 1):
        raise ShapeError(f"AffineGrid: theta {tuple(theta_shape)} and size {dims} must be (N, 2, 3) with "
                         "(N, C, H, W), or (N, 3, 4) with (N, C, D, H, W)")  # fmt: skip
    return dims


def affine_grid(node: Node, opset: int) -> Fn:
    """The normalized coordinates (x, y[, z]) of every output pixel, transformed by each batch's theta."""
    align = bool(node.attrs.get("align_corners", 0))

    def axis(length: int) -> np.ndarray:
        if align:
            return np.linspace(-1.0, 1.0, length) if length > 1 else np.zeros(length)
        return (2 * np.arange(length) + 1) / length - 1

    def run(theta: np.ndarray, size: np.ndarray) -> np.ndarray:
        dims = _affine_size(theta.shape, size)
        mesh = np.meshgrid(*(axis(d) for d in dims[2:]), indexing="ij")
        base = np.stack([*reversed(mesh), np.ones_like(mesh[0])], axis=-1)  # x first, then the constant 1
        grid = np.einsum("...k,njk->n...j", base, theta.astype(np.float64))
        return grid.astype(theta.dtype)

    return run


def affine_grid_torch(node: Node, opset: int) -> Fn:
    align = bool(node.attrs.get("align_corners", 0))

    def run(theta: Any, size: Any) -> Any:
        return F.affine_grid(theta, _affine_size(tuple(theta.shape), size), align_corners=align)

    return run


def affine_grid_size(node: Node, args: list, opset: int) -> tuple[tuple[int, ...], int]:
    dims = _affine_size(tuple(args[0].shape), args[1])
    return (dims[0], *dims[2:], len(dims) - 2), itemsize(args[0])


op("AffineGrid", affine_grid, affine_grid_torch, shape_inputs=(1,), size=affine_grid_size)
