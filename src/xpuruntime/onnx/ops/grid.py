"""GridSample (opset 16 to 22: 2-D and N-D, linear / nearest / cubic, zeros / border / reflection padding,
align_corners) and AffineGrid. The NumPy path interpolates in float64 over any number of spatial dims; the GPU
path runs PyTorch's grid_sample (4-D and 5-D), which defines the same sampling."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from ...errors import ShapeError
from ...graph.ir import Node
from ..errors import UnsupportedModelError
from .record import F, Fn, LoadContext, op

MODES = {"bilinear": "linear", "linear": "linear", "nearest": "nearest", "bicubic": "cubic", "cubic": "cubic"}
PADDINGS = ("zeros", "border", "reflection")


def check_grid_sample(node: Node, ctx: LoadContext) -> None:
    mode, padding = (
        node.attrs.get("mode", "linear" if ctx.graph.opset >= 20 else "bilinear"),
        node.attrs.get("padding_mode", "zeros"),
    )
    if mode not in MODES or padding not in PADDINGS:
        raise UnsupportedModelError(
            f"{node.describe()}: mode={mode!r} / padding_mode={padding!r} is not supported; supported modes "
            f"{sorted(MODES)}, paddings {list(PADDINGS)}"
        )


def _unnormalize(g: np.ndarray, size: int, align: bool) -> np.ndarray:
    return (g + 1) / 2 * (size - 1) if align else ((g + 1) * size - 1) / 2


def _reflect(x: np.ndarray, low: float, high: float) -> np.ndarray:
    span = high - low
    if span <= 0:
        return np.zeros_like(x)
    d = np.abs(x - low)
    flips, extra = np.floor(d / span), np.mod(d, span)
    return np.where(flips % 2 == 0, low + extra, high - extra)


def _pad_coordinate(x: np.ndarray, size: int, padding: str, align: bool) -> np.ndarray:
    """Source coordinates moved into the input for border and reflection padding (zeros: left as they are)."""
    if padding == "border":
        return np.clip(x, 0, size - 1)
    if padding == "reflection":
        x = _reflect(x, 0, size - 1) if align else _reflect(x, -0.5, size - 0.5)
        return np.clip(x, 0, size - 1)
    return x


def _cubic_weights(t: np.ndarray, a: float = -0.75) -> list[np.ndarray]:
    def near(d: np.ndarray) -> np.ndarray:
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d: np.ndarray) -> np.ndarray:
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def grid_sample_numpy(x: np.ndarray, grid: np.ndarray, mode: str, padding: str, align: bool) -> np.ndarray:
    n, c, *spatial = x.shape
    dims = len(spatial)
    if grid.ndim != dims + 2 or grid.shape[0] != n or grid.shape[-1] != dims:
        raise ShapeError(f"GridSample: grid {grid.shape} does not fit input {x.shape}")
    out = grid.shape[1:-1]
    coords = [_unnormalize(grid[..., dims - 1 - d].astype(np.float64), spatial[d], align) for d in range(dims)]
    if mode != "cubic":
        coords = [_pad_coordinate(co, spatial[d], padding, align) for d, co in enumerate(coords)]
    data = x.astype(np.float64)
    batch = np.arange(n).reshape((n,) + (1,) * len(out))
    result = np.zeros((n, c, *out))

    def gather(index: list[np.ndarray]) -> np.ndarray:
        """Values at integer positions (N, *out) per channel: (N, C, *out); zeros outside (or padded)."""
        inside = np.ones(index[0].shape, bool)
        clamped = []
        for d, i in enumerate(index):
            if mode == "cubic" and padding != "zeros":
                i = np.round(_pad_coordinate(i.astype(np.float64), spatial[d], padding, align)).astype(np.int64)
            inside &= (i >= 0) & (i < spatial[d])
            clamped.append(np.clip(i, 0, spatial[d] - 1))
        values = np.moveaxis(data[(batch, slice(None), *clamped)], -1, 1)  # (N, *out, C) -> (N, C, *out)
        return values * np.expand_dims(inside, 1)

    if mode == "nearest":
        return gather([np.rint(co).astype(np.int64) for co in coords]).astype(x.dtype)
    if mode == "linear":
        base = [np.floor(co) for co in coords]
        frac = [co - b for co, b in zip(coords, base)]
        for corner in itertools.product((0, 1), repeat=dims):
            weight = math.prod(f if k else 1 - f for f, k in zip(frac, corner))
            result += gather([(b + k).astype(np.int64) for b, k in zip(base, corner)]) * np.expand_dims(weight, 1)
        return result.astype(x.dtype)
    base = [np.floor(co) for co in coords]
    weights = [_cubic_weights(co - b) for co, b in zip(coords, base)]
    for taps in itertools.product(range(4), repeat=dims):
        weight = math.prod(w[t] for w, t in zip(weights, taps))
        result += gather([(b + t - 1).astype(np.int64) for b, t in zip(base, taps)]) * np.expand_dims(weight, 1)
    return result.astype(x.dtype)


def _options(node: Node, opset: int) -> tuple[str, str, bool]:
    mode = MODES[node.attrs.get("mode", "linear" if opset >= 20 else "bilinear")]
    return mode, node.attrs.get("padding_mode", "zeros"), bool(node.attrs.get("align_corners", 0))


def grid_sample(node: Node, opset: int) -> Fn:
    mode, padding, align = _options(node, opset)
    return lambda x, grid: grid_sample_numpy(x, grid, mode, padding, align)


def grid_sample_torch(node: Node, opset: int) -> Fn:
    mode, padding, align = _options(node, opset)
    name = {"linear": "bilinear", "nearest": "nearest", "cubic": "bicubic"}[mode]

    def run(x: Any, grid: Any) -> Any:
        if x.dim() not in (4, 5) or (mode == "cubic" and x.dim() != 4):
            raise ShapeError(f"GridSample: the GPU path samples 4-D (and, but for cubic, 5-D) inputs, got {x.dim()}-D")
        return F.grid_sample(x, grid.to(x.dtype), mode=name, padding_mode=padding, align_corners=align)

    return run


op("GridSample", grid_sample, grid_sample_torch, check=check_grid_sample)


def affine_grid(node: Node, opset: int) -> Fn:
    align = bool(node.attrs.get("align_corners", 0))

    def run(theta: np.ndarray, size: np.ndarray) -> np.ndarray:
        """Each output location's normalized (x, y[, z], 1) transformed by its batch's theta."""
        n, _, *spatial = [int(v) for v in np.asarray(size).reshape(-1)]
        steps = [np.linspace(-1, 1, s) if align else (np.arange(s) * 2 + 1) / s - 1 for s in spatial]
        mesh = np.meshgrid(*steps, indexing="ij")  # over (D, H, W): x is the last dim's coordinate
        points = np.stack([*(m.reshape(-1) for m in reversed(mesh)), np.ones(mesh[0].size)])  # (dims + 1, P)
        grid = theta.astype(np.float64) @ points  # (N, dims, P)
        return grid.transpose(0, 2, 1).reshape(n, *spatial, len(spatial)).astype(theta.dtype)

    return run


op("AffineGrid", affine_grid, shape_inputs=(1,))
