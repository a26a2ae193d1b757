"""Shape and layout ONNX ops: Shape, Size, Reshape, Flatten, Transpose, Squeeze, Unsqueeze, Concat, Split,
Slice, Expand, Tile, Range, ConstantOfShape, SpaceToDepth / DepthToSpace, CenterCropPad, EyeLike. Their shape
operands (targets, axes, bounds) are read on the host; on the GPU path these are host arrays, so reading them
costs no sync."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...errors import ArgumentError, ShapeError
from ...graph.ir import GraphError, Node
from ..errors import UnsupportedModelError
from .record import (
    Fn,
    LoadContext,
    axis_index,
    check_elem_dtype,
    dtype_name,
    elem_dtype,
    ints,
    itemsize,
    op,
    scalar,
    tensor_device,
    to_host,
    torch,
    torch_dtype,
)


def shape(node: Node, opset: int) -> Fn:
    start, end = node.attrs.get("start", 0), node.attrs.get("end")
    return lambda x: np.array(tuple(x.shape)[start:end], np.int64)


def shape_torch(node: Node, opset: int) -> Fn:  # folded while planning unless the shape varies per run
    start, end = node.attrs.get("start", 0), node.attrs.get("end")
    return lambda x: torch.tensor(tuple(x.shape)[start:end], dtype=torch.int64, device=x.device)


op("Shape", shape, shape_torch, shape_only=True)


def size_torch(node: Node, opset: int) -> Fn:
    return lambda x: torch.tensor(x.numel(), dtype=torch.int64, device=x.device)


op("Size", lambda node, opset: lambda x: np.array(math.prod(x.shape), np.int64), size_torch, shape_only=True)


# -- Reshape and Flatten --------------------------------------------------------------------------------------
def reshape_1(node: Node, ctx: LoadContext) -> None:
    """Reshape-1 .. Reshape-4: the target is the `shape` attribute; later versions take it as input 1."""
    if ctx.graph.opset >= 5:
        return
    node.attrs.pop("consumed_inputs", None)
    target = node.attrs.pop("shape", None)
    if target is None:
        raise GraphError(f"{node.describe()}: Reshape before opset 5 needs its 'shape' attribute")
    name = ctx.graph.add_constant(f"{node.name}_shape", np.array(list(target), np.int64).reshape(-1))
    node.inputs = [node.inputs[0], name]


def reshape_dims(node: Node, x_shape: tuple[int, ...], target: Any) -> list[int]:
    """Reshape's target with its 0s (copy the input's dim, unless allowzero) written out. With allowzero, an empty
    input and a literal 0 beside a -1 (any size would do), the -1 is worked out from the non-zero dims on both
    sides, as onnxruntime does: batch size 0 through the dynamo exporter's Reshape(x, [batch, seq, -1, 64])."""
    dims = ints(target)
    if not node.attrs.get("allowzero", 0):
        return [x_shape[i] if d == 0 and i < len(x_shape) else d for i, d in enumerate(dims)]
    if dims.count(-1) == 1 and 0 in dims and 0 in x_shape:
        known = math.prod(d for d in dims if d not in (0, -1))
        total = math.prod(d for d in x_shape if d)
        if known and total % known == 0:
            dims[dims.index(-1)] = total // known
    return dims


def reshape(node: Node, opset: int) -> Fn:
    def run(x: np.ndarray, target: np.ndarray) -> np.ndarray:
        try:
            return x.reshape(reshape_dims(node, x.shape, target))
        except ValueError:
            raise ShapeError(f"Reshape: cannot reshape {x.shape} to {tuple(ints(target))}") from None

    return run


def reshape_torch(node: Node, opset: int) -> Fn:
    return lambda x, target: x.reshape(reshape_dims(node, tuple(x.shape), target))


op("Reshape", reshape, reshape_torch, shape_inputs=(1,), upgrade=reshape_1, views=True)


def _flatten(node: Node, opset: int) -> Fn:
    axis = node.attrs.get("axis", 1)

    def run(x: Any) -> Any:
        ax = axis % len(x.shape) if axis < 0 else axis
        return x.reshape(math.prod(x.shape[:ax]), math.prod(x.shape[ax:]))

    return run


op("Flatten", _flatten, _flatten, views=True)


def transpose(node: Node, opset: int) -> Fn:
    perm = node.attrs.get("perm")
    return lambda x: np.transpose(x, perm)


def transpose_torch(node: Node, opset: int) -> Fn:
    perm = node.attrs.get("perm")
    return lambda x: x.permute(*(perm if perm is not None else reversed(range(x.dim()))))


op("Transpose", transpose, transpose_torch, views=True)


# -- Squeeze and Unsqueeze --------------------------------------------------------------------------------------
def _axes(node: Node, opset: int, axes: Any) -> list[int]:
    """Squeeze / Unsqueeze axes: an input from opset 13, the attribute before."""
    return ints(axes) if opset >= 13 else list(node.attrs.get("axes") or ())


def squeeze(node: Node, opset: int) -> Fn:
    def run(x: np.ndarray, axes: np.ndarray | None = None) -> np.ndarray:
        raw = _axes(node, opset, axes)
        if not raw:
            return np.squeeze(x)
        ax = tuple(axis_index("Squeeze", a, x.ndim) for a in raw)
        if any(x.shape[a] != 1 for a in ax):
            raise ShapeError(f"Squeeze: axes {raw} of shape {x.shape} are not all 1")
        return np.squeeze(x, axis=ax)

    return run


def squeeze_torch(node: Node, opset: int) -> Fn:
    def run(x: Any, axes: Any = None) -> Any:
        raw = _axes(node, opset, axes)
        return x.squeeze(tuple(a % x.dim() for a in raw)) if raw else x.squeeze()

    return run


def _unsqueezed_axes(node: Node, opset: int, ndim: int, axes: Any) -> list[int]:
    raw = _axes(node, opset, axes)
    rank = ndim + len(raw)
    ax = sorted(axis_index("Unsqueeze", a, rank) for a in raw)
    if len(set(ax)) != len(ax):
        raise ArgumentError(f"Unsqueeze: repeated axes {raw}")
    return ax


def unsqueeze(node: Node, opset: int) -> Fn:
    return lambda x, axes=None: np.expand_dims(x, tuple(_unsqueezed_axes(node, opset, x.ndim, axes)))


def unsqueeze_torch(node: Node, opset: int) -> Fn:
    def run(x: Any, axes: Any = None) -> Any:
        for a in _unsqueezed_axes(node, opset, x.dim(), axes):
            x = x.unsqueeze(a)
        return x

    return run


op("Squeeze", squeeze, squeeze_torch, shape_inputs=(1,), views=True)
op("Unsqueeze", unsqueeze, unsqueeze_torch, shape_inputs=(1,), views=True)


# -- Concat and Split -------------------------------------------------------------------------------------------
def concat_3(node: Node, ctx: LoadContext) -> None:
    """Concat before opset 4 concatenates along axis 1 by default."""
    if ctx.graph.opset < 4:
        node.attrs.setdefault("axis", 1)


def concat_size(node: Node, args: list, opset: int) -> tuple[tuple[int, ...], int]:
    arrays = [a for a in args if a is not None]
    shape = list(arrays[0].shape)
    if shape:
        ax = node.attrs.get("axis", 0) % len(shape)
        shape[ax] = sum(a.shape[ax] if len(a.shape) == len(shape) else 0 for a in arrays)
    return tuple(shape), itemsize(arrays[0])


op("Concat", lambda node, opset: lambda *xs: np.concatenate(xs, axis=node.attrs["axis"]),
   lambda node, opset: lambda *xs: torch.cat(xs, dim=node.attrs["axis"]), upgrade=concat_3,
   size=concat_size)  # fmt: skip


def split_sizes(node: Node, x_shape: tuple[int, ...], split: Any) -> tuple[int, list[int]]:
    """The split axis (as an index) and the size of every part: from the `split` input, the attribute
    (Split-1 takes either), or equal parts (the last one smaller) for `num_outputs` or the outputs."""
    axis = node.attrs.get("axis", 0)
    ax = axis_index("Split", axis, len(x_shape))
    sizes = ints(split) if split is not None else list(node.attrs.get("split") or ())
    n = x_shape[ax]
    if not sizes:
        parts = node.attrs.get("num_outputs") or len(node.outputs)
        chunk = -(-n // parts)
        sizes = [min(chunk, max(n - i * chunk, 0)) for i in range(parts)]
    if sum(sizes) != n:
        raise ShapeError(f"Split: sizes {sizes} do not add up to dim {n} of axis {axis}")
    return ax, sizes


def split(node: Node, opset: int) -> Fn:
    def run(x: np.ndarray, sizes: np.ndarray | None = None) -> tuple:
        ax, parts = split_sizes(node, x.shape, sizes)
        return tuple(np.split(x, np.cumsum(parts)[:-1], axis=ax))

    return run


def split_torch(node: Node, opset: int) -> Fn:
    def run(x: Any, sizes: Any = None) -> tuple:
        ax, parts = split_sizes(node, tuple(x.shape), sizes)
        return tuple(torch.split(x, parts, dim=ax))

    return run


op("Split", split, split_torch, shape_inputs=(1,), tuple_output=True, views=True)


# -- Slice ------------------------------------------------------------------------------------------------------
def slice_bounds(x_shape: tuple[int, ...], starts: Any, ends: Any, axes: Any, steps: Any) -> list[tuple]:
    """(axis, start, end, step) per sliced axis, clamped as Python slicing would (end -1: to the front)."""
    starts, ends = ints(starts), ints(ends)
    axes = ints(axes) if axes is not None else list(range(len(starts)))
    steps = ints(steps) if steps is not None else [1] * len(starts)
    bounds = []
    for start, end, axis, step in zip(starts, ends, axes, steps):
        if step == 0:
            raise ArgumentError("Slice: a step of 0")
        ax = axis_index("Slice", axis, len(x_shape))
        dim = x_shape[ax]
        start = start + dim if start < 0 else start
        end = end + dim if end < 0 else end
        if step > 0:
            start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        else:
            start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
        bounds.append((ax, start, end, step))
    return bounds


def _slice_1(run: Fn, node: Node, opset: int) -> Fn:
    """Slice-1: starts, ends and axes are attributes."""
    if opset >= 10:
        return run
    bounds = (node.attrs["starts"], node.attrs["ends"], node.attrs.get("axes"))
    return lambda x: run(x, *bounds)


def slice_(node: Node, opset: int) -> Fn:
    def run(x: np.ndarray, starts: Any, ends: Any, axes: Any = None, steps: Any = None) -> np.ndarray:
        index = [slice(None)] * x.ndim
        for ax, start, end, step in slice_bounds(x.shape, starts, ends, axes, steps):
            index[ax] = slice(start, None if end < 0 else end, step)
        return x[tuple(index)]

    return _slice_1(run, node, opset)


def slice_torch(node: Node, opset: int) -> Fn:
    def run(x: Any, starts: Any, ends: Any, axes: Any = None, steps: Any = None) -> Any:
        for ax, start, end, step in slice_bounds(tuple(x.shape), starts, ends, axes, steps):
            if step > 0:
                x = x.narrow(ax, start, max(end - start, 0))[(slice(None),) * ax + (slice(None, None, step),)]
            else:  # negative steps: gather the indices Python's slicing picks
                picked = list(range(x.shape[ax]))[slice(start, None if end < 0 else end, step)]
                x = torch.index_select(x, ax, torch.tensor(picked, dtype=torch.long, device=x.device))
        return x

    return _slice_1(run, node, opset)


op("Slice", slice_, slice_torch, shape_inputs=(1, 2, 3, 4), views=True)


# -- Expand and Tile --------------------------------------------------------------------------------------------
def expanded_shape(x_shape: tuple[int, ...], target: Any) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(tuple(x_shape), tuple(ints(target))))
    except ValueError:
        raise ShapeError(f"Expand: shape {tuple(x_shape)} cannot be broadcast to {tuple(ints(target))}") from None


def expand_size(node: Node, args: list, opset: int) -> tuple[tuple[int, ...], int]:
    return expanded_shape(tuple(args[0].shape), args[1]), itemsize(args[0])


op("Expand", lambda node, opset: lambda x, target: np.broadcast_to(x, expanded_shape(x.shape, target)),
   lambda node, opset: lambda x, target: x.expand(expanded_shape(tuple(x.shape), target)),
   shape_inputs=(1,), size=expand_size, views=True)  # fmt: skip


def tile_size(node: Node, args: list, opset: int) -> tuple[tuple[int, ...], int]:
    x = args[0]
    repeats = tile_repeats(opset, len(x.shape), *args[1:])
    return tuple(n * r for n, r in zip(x.shape, repeats)), itemsize(x)


def tile_repeats(opset: int, ndim: int, repeats: Any, axis: Any = None) -> list[int]:
    """Tile's repeats per dim; Tile-1 takes `tiles` copies along one `axis` (both inputs)."""
    if opset >= 6:
        return ints(repeats)
    counts = [1] * ndim
    counts[axis_index("Tile", ints(axis)[0], ndim)] = ints(repeats)[0]
    return counts


op("Tile", lambda node, opset: lambda x, *rest: np.tile(x, tile_repeats(opset, x.ndim, *rest)),
   lambda node, opset: lambda x, *rest: x.repeat(*tile_repeats(opset, x.dim(), *rest)),
   shape_inputs=(1, 2), size=tile_size)  # fmt: skip


# -- Range and ConstantOfShape ----------------------------------------------------------------------------------
def range_length(start: float, limit: float, delta: float) -> int:
    if delta == 0:
        raise ArgumentError("Range: delta is 0")
    return max(math.ceil((limit - start) / delta), 0)


def range_(node: Node, opset: int) -> Fn:
    def run(start: np.ndarray, limit: np.ndarray, delta: np.ndarray) -> np.ndarray:
        s, d = start.item(), delta.item()
        return (s + d * np.arange(range_length(s, limit.item(), d))).astype(start.dtype)

    return run


def range_torch(node: Node, opset: int) -> Fn:
    def run(start: Any, limit: Any, delta: Any) -> Any:
        s, lim, d = (float(scalar(v)) for v in (start, limit, delta))
        dtype = torch_dtype(np.asarray(to_host(start)).dtype.name)
        device = tensor_device((start, limit, delta))
        return (s + d * torch.arange(range_length(s, lim, d), dtype=torch.float64, device=device)).to(dtype)

    return run


def range_size(node: Node, args: list, opset: int) -> tuple[tuple[int, ...], int]:
    start, limit, delta = (float(scalar(v)) for v in args)
    return (range_length(start, limit, delta),), itemsize(args[0])


op("Range", range_, range_torch, shape_inputs=(0, 1, 2), size=range_size)


def constant_fill(node: Node) -> np.ndarray:
    """ConstantOfShape's value: a one-element array (0.0 as float32 when left out)."""
    value = node.attrs.get("value")
    return np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)


def constant_dims(target: Any) -> list[int]:
    dims = ints(target)
    if any(d < 0 for d in dims):
        raise ShapeError(f"ConstantOfShape: negative dims {dims}")
    return dims


def constant_of_shape(node: Node, opset: int) -> Fn:
    fill = constant_fill(node)
    return lambda target: np.full(constant_dims(target), fill[0], fill.dtype)


def constant_of_shape_torch(node: Node, opset: int) -> Fn:
    fill = constant_fill(node)
    return lambda target: torch.full(constant_dims(target), fill[0].item(), dtype=torch_dtype(fill.dtype.name))


op("ConstantOfShape", constant_of_shape, constant_of_shape_torch, shape_inputs=(0,),
   size=lambda node, args, opset: (tuple(constant_dims(args[0])), constant_fill(node).dtype.itemsize))  # fmt: skip


# -- SpaceToDepth and DepthToSpace ------------------------------------------------------------------------------
def _block_layout(node: Node, shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """SpaceToDepth and DepthToSpace as reshape -> transpose -> reshape of an N x C x H x W input: the first
    shape, the permutation and the final shape. `mode` DCR (the default) orders the moved values depth,
    column, row; CRD column, row, depth."""
    b, mode = int(node.attrs["blocksize"]), node.attrs.get("mode", "DCR")
    if len(shape) != 4 or b <= 0:
        raise ShapeError(f"{node.op}: expected a 4-d N x C x H x W input and blocksize > 0, got {shape}, {b}")
    n, c, h, w = shape
    if node.op == "SpaceToDepth":
        if h % b or w % b:
            raise ShapeError(f"SpaceToDepth: H and W of {shape} must be multiples of blocksize {b}")
        perm = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
        return (n, c, h // b, b, w // b, b), perm, (n, c * b * b, h // b, w // b)
    if c % (b * b):
        raise ShapeError(f"DepthToSpace: C of {shape} must be a multiple of blocksize^2 = {b * b}")
    if mode == "DCR":
        return (n, b, b, c // (b * b), h, w), (0, 3, 4, 1, 5, 2), (n, c // (b * b), h * b, w * b)
    return (n, c // (b * b), b, b, h, w), (0, 1, 4, 2, 5, 3), (n, c // (b * b), h * b, w * b)


def check_block_mode(node: Node, ctx: LoadContext) -> None:
    if node.attrs.get("mode", "DCR") not in ("DCR", "CRD"):
        raise UnsupportedModelError(f"{node.describe()}: mode must be 'DCR' or 'CRD', got {node.attrs['mode']!r}")


def space_depth(node: Node, opset: int) -> Fn:
    def run(x: np.ndarray) -> np.ndarray:
        first, perm, final = _block_layout(node, x.shape)
        return x.reshape(first).transpose(perm).reshape(final)

    return run


def space_depth_torch(node: Node, opset: int) -> Fn:
    def run(x: Any) -> Any:
        first, perm, final = _block_layout(node, tuple(x.shape))
        return x.reshape(first).permute(perm).reshape(final)

    return run


op("SpaceToDepth", space_depth, space_depth_torch, check=check_block_mode)
op("DepthToSpace", space_depth, space_depth_torch, check=check_block_mode)


# -- CenterCropPad ----------------------------------------------------------------------------------------------
def center_windows(node: Node, shape: tuple[int, ...], target: Any) -> tuple[list[slice], list[slice], list[int]]:
    """Where the input's centered window lands in the output: the input's and the output's slice per dim,
    and the output shape. A crop starts half the difference in (rounded down), a pad puts the odd pixel on
    the right."""
    dims = ints(target)
    axes = [axis_index("CenterCropPad", a, len(shape)) for a in node.attrs.get("axes", range(len(shape)))]
    if len(dims) != len(axes) or any(d < 0 for d in dims):
        raise ShapeError(f"CenterCropPad: shape {dims} must give one size >= 0 per axis of {axes}")
    source, dest, out = [slice(None)] * len(shape), [slice(None)] * len(shape), list(shape)
    for axis, size in zip(axes, dims):
        have = shape[axis]
        out[axis] = size
        if have >= size:
            start = (have - size) // 2
            source[axis] = slice(start, start + size)
        else:
            start = (size - have) // 2
            dest[axis] = slice(start, start + have)
    return source, dest, out


def center_crop_pad(node: Node, opset: int) -> Fn:
    def run(x: np.ndarray, target: np.ndarray) -> np.ndarray:
        source, dest, shape = center_windows(node, x.shape, target)
        out = np.zeros(shape, x.dtype)
        out[tuple(dest)] = x[tuple(source)]
        return out

    return run


def center_crop_pad_torch(node: Node, opset: int) -> Fn:
    def run(x: Any, target: Any) -> Any:
        source, dest, shape = center_windows(node, tuple(x.shape), target)
        out = x.new_zeros(shape)
        out[tuple(dest)] = x[tuple(source)]
        return out

    return run


def center_crop_pad_size(node: Node, args: list, opset: int) -> tuple[tuple[int, ...], int]:
    return tuple(center_windows(node, tuple(args[0].shape), args[1])[2]), itemsize(args[0])


op("CenterCropPad", center_crop_pad, center_crop_pad_torch, shape_inputs=(1,), size=center_crop_pad_size)


# -- EyeLike ----------------------------------------------------------------------------------------------------
def eye_like(node: Node, opset: int) -> Fn:
    k = node.attrs.get("k", 0)

    def run(x: np.ndarray) -> np.ndarray:
        if x.ndim != 2:
            raise ShapeError(f"EyeLike: expected a 2-d input, got shape {x.shape}")
        return np.eye(*x.shape, k=k, dtype=elem_dtype(node, "dtype", np.dtype(dtype_name(x))))  # x may be a tensor

    return run


def eye_like_torch(node: Node, opset: int) -> Fn:
    k = node.attrs.get("k", 0)

    def run(x: Any) -> Any:
        if x.dim() != 2:
            raise ShapeError(f"EyeLike: expected a 2-d input, got shape {tuple(x.shape)}")
        dtype = elem_dtype(node, "dtype")
        rows, cols = x.shape
        out = torch.zeros((rows, cols), dtype=x.dtype if dtype is None else torch_dtype(dtype.name), device=x.device)
        return out.diagonal(k).fill_(1).base if min(rows, cols) and -rows < k < cols else out

    return run


op("EyeLike", eye_like, eye_like_torch, shape_only=True, check=check_elem_dtype("dtype"))
