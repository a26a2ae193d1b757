"""Resize (opset 10 to 19) and Upsample (1, 7, 9) as separable interpolation.

Every mode the session runs is a product of 1-D filters, so a resize is one pass per resized axis: each
output position along the axis reads `taps` input positions (clamped to the edge, as ONNX pads) with
weights. The taps are small host arrays worked out from the input shape and the scales, sizes and roi
(`axis_taps`, cached); NumPy and PyTorch (the GPU path) apply the same taps. With `scales` given, source
coordinates follow onnxruntime's float32 formulas (float rounding decides a nearest-neighbour tie). With
`sizes`, the scale is the exact ratio of the integer lengths and coordinates are worked out from them in
float64, so a coordinate exactly halfway between two pixels stays exact and nearest_mode decides it (as
onnxruntime and the ONNX reference do).

Linear and cubic resizes interpolate in float32 or float64 and round integer data back, half to even and
saturating; bool data resizes as 0 and 1 (neither the spec, onnxruntime nor the reference defines it). A
resize that only copies (nearest, or no axis changed) keeps the data in its own dtype.

Resize-18's `antialias=1` stretches the linear and cubic filters of an axis that shrinks by 1/scale, so that
they low-pass the input: an output reads every input within the stretched support, weighted by the kernel
of the scaled distance and normalized to sum 1 (`_filter_taps`; nearest, and axes that grow, are as without).

Declined, with an UnsupportedModelError naming the node and the attribute: attribute values no opset defines.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from ...errors import ArgumentError, ShapeError
from ...graph.ir import GraphError, Node
from ..errors import UnsupportedModelError
from .record import DeviceCache, Fn, LoadContext, dtype_name, itemsize, op, to_host, torch, torch_dtype

MODES = ("nearest", "linear", "cubic")
COORDINATES = (
    "half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
    "tf_crop_and_resize", "tf_half_pixel_for_nn",
)  # fmt: skip
NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
POLICIES = ("stretch", "not_larger", "not_smaller")
LEGACY = "legacy"  # Upsample and Resize-10: floor when upsampling, ceil when downsampling (as onnxruntime)
Scale = np.float32 | Fraction  # a given scale (float32, as onnxruntime's) or one from sizes (exact)


@dataclass(frozen=True)
class ResizeSpec:
    """A Resize or Upsample node's attributes, checked once when the model is loaded."""

    mode: str = "nearest"
    coordinates: str = "half_pixel"
    nearest: str = "round_prefer_floor"
    cubic_a: float = -0.75
    exclude_outside: bool = False
    extrapolation: float = 0.0
    axes: tuple[int, ...] | None = None
    policy: str = "stretch"
    legacy_inputs: bool = False  # (X, scales) only: Upsample-9/10 and Resize-10
    antialias: bool = False  # Resize-18: linear and cubic filters stretched when downsampling
    op: str = "Resize"  # or Upsample: the name errors give


@dataclass(frozen=True)
class AxisTaps:
    """One resized axis: output i reads index[i, :] weighted by weight[i, :] (None: one tap, a copy);
    `outside[i]` marks tf_crop_and_resize positions that take the extrapolation value."""

    axis: int
    index: np.ndarray
    weight: np.ndarray | None
    outside: np.ndarray | None


def resize_spec(node: Node, opset: int) -> ResizeSpec:
    """The node's ResizeSpec; UnsupportedModelError naming the node and attribute for what is declined."""
    at = node.attrs
    if node.op == "Upsample" or opset < 11:  # Upsample-1 (bilinear) is renamed by upsample_7
        mode = _choice(node, "mode", at.get("mode", "nearest"), ("nearest", "linear"))
        return ResizeSpec(mode, "asymmetric", LEGACY, legacy_inputs=True, op=node.op)
    coordinates = COORDINATES if opset < 13 else COORDINATES[:-1]  # tf_half_pixel_for_nn: Resize-11 only
    axes = at.get("axes")
    return ResizeSpec(
        mode=_choice(node, "mode", at.get("mode", "nearest"), MODES),
        coordinates=_choice(node, "coordinate_transformation_mode", at.get("coordinate_transformation_mode",
                                                                             "half_pixel"), coordinates),
        nearest=_choice(node, "nearest_mode", at.get("nearest_mode", "round_prefer_floor"), NEAREST),
        cubic_a=float(at.get("cubic_coeff_a", -0.75)),
        exclude_outside=bool(at.get("exclude_outside", 0)),
        extrapolation=float(at.get("extrapolation_value", 0.0)),
        axes=None if axes is None else tuple(int(a) for a in axes),
        policy=_choice(node, "keep_aspect_ratio_policy", at.get("keep_aspect_ratio_policy", "stretch"), POLICIES),
        antialias=_antialias(node),
    )  # fmt: skip


def _antialias(node: Node) -> bool:
    """The antialias attribute (Resize-18; the importer refuses it at earlier opsets): 0 or 1."""
    value = node.attrs.get("antialias", 0)
    if value not in (0, 1):
        raise UnsupportedModelError(
            f"{node.describe()}: attribute antialias={value!r} is not supported; supported: 0, 1"
        )
    return bool(value)


def _choice(node: Node, name: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise UnsupportedModelError(
            f"{node.describe()}: attribute {name}={value!r} is not supported; supported: {', '.join(allowed)}"
        )
    return value


# -- output sizes and scales -------------------------------------------------------------------------------
def _floats(x: Any) -> tuple[float, ...] | None:
    """An optional input as floats; None when it is left out or empty (Resize-11 passes empty tensors)."""
    if x is None or np.size(x) == 0:
        return None
    return tuple(float(v) for v in np.asarray(x, np.float32).reshape(-1))


def _ints(x: Any) -> tuple[int, ...] | None:
    if x is None or np.size(x) == 0:
        return None
    return tuple(int(v) for v in np.asarray(x).reshape(-1))


def split_inputs(spec: ResizeSpec, rest: tuple) -> tuple[Any, Any, Any]:
    """(roi, scales, sizes) from the node's inputs after X (Upsample and Resize-10 take scales only)."""
    if spec.legacy_inputs:
        return None, (rest[0] if rest else None), None
    roi, scales, sizes = (*rest, None, None, None)[:3]
    return roi, scales, sizes


def taps_key(shape: tuple[int, ...], roi: Any, scales: Any, sizes: Any) -> tuple:
    """What the taps depend on besides the spec, as hashable host values."""
    return tuple(shape), _floats(roi), _floats(scales), _ints(sizes)


def axis_taps(spec: ResizeSpec, key: tuple) -> tuple[tuple[int, ...], tuple[AxisTaps, ...]]:
    """The output shape and the taps of every axis that changes (host arrays, cached; see taps_key)."""
    return _cached_taps(spec, *key)


def outside_mask(taps: tuple[AxisTaps, ...], ndim: int) -> np.ndarray | None:
    """Where tf_crop_and_resize extrapolates, broadcastable to the output; None when nowhere."""
    mask = None
    for tap in taps:
        if tap.outside is not None:
            along = tap.outside.reshape((-1,) + (1,) * (ndim - tap.axis - 1))
            mask = along if mask is None else mask | along
    return mask


@functools.lru_cache(maxsize=256)
def _cached_taps(
    spec: ResizeSpec, shape: tuple[int, ...], roi: tuple | None, scales: tuple | None, sizes: tuple | None
) -> tuple[tuple[int, ...], tuple[AxisTaps, ...]]:
    rank, op = len(shape), spec.op
    axes = _axes(spec, rank)
    if (scales is None) == (sizes is None):
        which = "both" if scales is not None else "neither"
        raise ArgumentError(f"{op}: expects exactly one of 'scales' and 'sizes' (non-empty), got {which}")
    given = scales if scales is not None else sizes
    if len(given) != len(axes):
        what = "scales" if scales is not None else "sizes"
        raise ShapeError(f"{op}: {what} has {len(given)} values for {len(axes)} axes of an input of shape {shape}")
    if spec.coordinates == "tf_crop_and_resize" and (roi is None or len(roi) != 2 * len(axes)):
        raise ShapeError(f"{op}: tf_crop_and_resize needs an roi of {2 * len(axes)} values, got {roi}")
    out_sizes, axis_scales = _sizes_and_scales(spec, shape, axes, scales, sizes)
    out_shape = list(shape)
    taps = []
    for i, axis in enumerate(axes):
        out_shape[axis] = out_sizes[i]
        bounds = (roi[i], roi[len(axes) + i]) if spec.coordinates == "tf_crop_and_resize" else (0.0, 1.0)
        if axis_scales[i] == 1 and out_sizes[i] == shape[axis] and bounds == (0.0, 1.0):
            continue  # an axis left as it is, whatever the coordinate mode says (as onnxruntime)
        tap = _one_axis(spec, axis, shape[axis], out_sizes[i], axis_scales[i], bounds)
        if tap is not None:
            taps.append(tap)
    return tuple(out_shape), tuple(taps)


def _axes(spec: ResizeSpec, rank: int) -> list[int]:
    if spec.axes is None:
        return list(range(rank))
    if any(not -rank <= a < rank for a in spec.axes):
        raise ShapeError(f"{spec.op}: axes {list(spec.axes)} out of range for a rank-{rank} input")
    axes = [a % rank for a in spec.axes]
    if len(set(axes)) != len(axes):
        raise ArgumentError(f"{spec.op}: repeated axes {list(spec.axes)}")
    return axes


def _sizes_and_scales(
    spec: ResizeSpec, shape: tuple[int, ...], axes: list[int], scales: tuple | None, sizes: tuple | None
) -> tuple[list[int], list[Scale]]:
    """Output sizes and the scales the coordinates use: given scales in float32, as onnxruntime computes
    them; with sizes, exact ratios of the lengths (Fractions)."""
    if scales is not None:
        if any(s <= 0 for s in scales):
            raise ArgumentError(f"{spec.op}: scales must be positive, got {list(scales)}")
        factors = [np.float32(s) for s in scales]
        return [int(s * np.float32(shape[a])) for s, a in zip(factors, axes)], factors
    if any(s < 0 for s in sizes):
        raise ArgumentError(f"{spec.op}: sizes must not be negative, got {list(sizes)}")
    ratios = [_size_ratio(spec, shape[a], s, a) for a, s in zip(axes, sizes)]
    if spec.policy == "stretch":
        return list(sizes), ratios
    common = min(ratios) if spec.policy == "not_larger" else max(ratios)
    return [math.floor(common * shape[a] + Fraction(1, 2)) for a in axes], [common] * len(axes)


def _size_ratio(spec: ResizeSpec, n_in: int, n_out: int, axis: int) -> Fraction:
    """n_out / n_in exactly; an empty axis can only stay empty (its ratio is then 1, as onnxruntime's)."""
    if n_in:
        return Fraction(n_out, n_in)
    if n_out:
        raise ShapeError(
            f"{spec.op}: axis {axis} of the input is empty (dim 0) but the output needs {n_out} elements along "
            "it: no scale makes a non-empty dim of an empty one"
        )
    return Fraction(1)


# -- one axis -----------------------------------------------------------------------------------------------
def _coordinates(spec: ResizeSpec, n_in: int, n_out: int, scale: Scale, roi: tuple) -> np.ndarray:
    """x_original for every output position of an axis (float32, onnxruntime's formulas; see _over)."""
    x = np.arange(n_out, dtype=np.float32)
    mode = spec.coordinates
    if mode == "asymmetric":
        return _over(x, scale)
    if mode == "tf_half_pixel_for_nn":
        return _over(x + 0.5, scale)
    if mode == "half_pixel":
        return _over(x + 0.5, scale) - 0.5
    if mode == "pytorch_half_pixel":
        return _over(x + 0.5, scale) - 0.5 if n_out > 1 else np.zeros_like(x)
    if mode == "half_pixel_symmetric":
        return _symmetric_offset(n_in, n_out, scale) + _over(x + 0.5, scale) - 0.5
    if mode == "align_corners":
        return x * np.float32(n_in - 1) / np.float32(n_out - 1) if n_out > 1 else np.zeros_like(x)
    start, end = np.float32(roi[0]), np.float32(roi[1])  # tf_crop_and_resize
    if n_out == 1:
        return np.full(1, 0.5 * (start + end) * (n_in - 1), np.float32)
    return start * np.float32(n_in - 1) + x * (end - start) * np.float32(n_in - 1) / np.float32(n_out - 1)


def _over(x: np.ndarray, scale: Scale) -> np.ndarray:
    """x / scale: in float32 for a given scale; for an exact ratio p/q, x * q / p in float64, one rounding
    of an exact quotient, so that a coordinate exactly halfway between two pixels stays exact."""
    if isinstance(scale, Fraction):
        return x.astype(np.float64) * scale.denominator / scale.numerator
    return x / scale


def _symmetric_offset(n_in: int, n_out: int, scale: Scale) -> Any:
    """half_pixel_symmetric's offset n_in / 2 * (1 - n_out / (scale * n_in)), exact for an exact scale."""
    if isinstance(scale, Fraction):
        return float(Fraction(n_in, 2) * (1 - n_out / (scale * n_in)))
    adjustment = np.float32(n_out) / (scale * np.float32(n_in))
    return np.float32(n_in) / 2 * (1 - adjustment)


def _nearest(spec: ResizeSpec, x: np.ndarray, scale: Scale) -> np.ndarray:
    rule = spec.nearest
    if rule == LEGACY:
        rule = "ceil" if scale < 1 else "floor"
    if rule == "round_prefer_floor":
        return np.ceil(x - 0.5)
    if rule == "round_prefer_ceil":
        return np.floor(x + 0.5)
    return np.floor(x) if rule == "floor" else np.ceil(x)


def _cubic(distance: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel with coefficient `a`."""
    d = np.abs(distance)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def _triangle(distance: np.ndarray) -> np.ndarray:
    """The linear interpolation kernel (a tent of half-width 1)."""
    return np.maximum(1 - np.abs(distance), 0.0)


def _one_axis(spec: ResizeSpec, axis: int, n_in: int, n_out: int, scale: Scale, roi: tuple) -> AxisTaps | None:
    """The taps of one axis; None when the axis comes out as it went in."""
    x = _coordinates(spec, n_in, n_out, scale, roi)
    outside = None
    if spec.coordinates == "tf_crop_and_resize":
        outside = (x < 0) | (x > n_in - 1)
        outside = outside if outside.any() else None
    if spec.mode == "nearest":
        index, weight = _nearest(spec, x, scale).astype(np.int64)[:, None], None
    else:
        index, weight = _filter_taps(spec, x, n_in, scale)
    index = np.clip(index, 0, max(n_in - 1, 0))
    if outside is None and n_out == n_in and _is_identity(index, weight):
        return None
    return AxisTaps(axis, index, weight, outside)


def _filter_taps(spec: ResizeSpec, x: np.ndarray, n_in: int, scale: Scale) -> tuple[np.ndarray, np.ndarray]:
    """Linear or cubic taps (unclamped) for source coordinates x: every input within the filter's support,
    which antialias stretches by 1/scale when downsampling so that the filter low-passes."""
    stretch = min(float(scale), 1.0) if spec.antialias else 1.0
    support = (1 if spec.mode == "linear" else 2) / stretch  # half-width, in input pixels
    reach = math.ceil(support)
    offsets = np.arange(1 - reach, reach + 1)  # linear: 0, 1; cubic: -1..2 (unstretched)
    base = np.floor(x)
    distance = (offsets[None, :] - (x - base).astype(np.float64)[:, None]) * stretch
    weight = _triangle(distance) if spec.mode == "linear" else _cubic(distance, spec.cubic_a)
    index = base.astype(np.int64)[:, None] + offsets[None, :]
    if spec.exclude_outside:
        weight = np.where((index < 0) | (index >= n_in), 0.0, weight)
    if spec.exclude_outside or stretch < 1:
        total = weight.sum(axis=1, keepdims=True)
        weight = weight / np.where(total == 0, 1.0, total)
    return index, weight


def _is_identity(index: np.ndarray, weight: np.ndarray | None) -> bool:
    rows = np.arange(index.shape[0])[:, None]
    if weight is None:
        return bool(np.array_equal(index[:, 0], rows[:, 0]))
    return bool(np.all(np.where(index == rows, weight, 0.0).sum(axis=1) == 1) and np.all(np.abs(weight).sum(1) == 1))


# -- data types ---------------------------------------------------------------------------------------------
def working_dtype(taps: tuple[AxisTaps, ...], dtype: str) -> str:
    """The dtype (by name) the taps are applied in: the data's own where they only copy (nearest, or no
    axis changed: int64 above 2**53 stays exact), else float64 (float64, integer and bool data) or float32."""
    if all(tap.weight is None for tap in taps):
        return dtype
    return "float64" if dtype == "float64" or saturation(dtype) is not None else "float32"


def saturation(dtype: str) -> tuple[int, int] | None:
    """The range interpolated integer (or bool, as 0 and 1) data is rounded into; None for floats."""
    if dtype == "bool":
        return 0, 1
    return None if dtype.startswith(("float", "bfloat", "complex")) else (np.iinfo(dtype).min, np.iinfo(dtype).max)


# -- NumPy ----------------------------------------------------------------------------------------------------
def resize(spec: ResizeSpec, x: np.ndarray, *rest: Any) -> np.ndarray:
    """Resize `x`; `rest` is the node's other inputs."""
    _, taps = axis_taps(spec, taps_key(x.shape, *split_inputs(spec, rest)))
    work = working_dtype(taps, x.dtype.name)
    y = x if work == x.dtype.name else x.astype(work)
    for tap in taps:
        y = _apply(y, tap)
    mask = outside_mask(taps, y.ndim)
    if mask is not None:
        y = np.where(mask, np.asarray(spec.extrapolation).astype(y.dtype), y)
    return _to_dtype(y, x.dtype)


def _apply(y: np.ndarray, tap: AxisTaps) -> np.ndarray:
    if tap.weight is None:
        return np.take(y, tap.index[:, 0], axis=tap.axis)
    along = (-1,) + (1,) * (y.ndim - tap.axis - 1)
    total = None
    for j in range(tap.index.shape[1]):
        term = np.take(y, tap.index[:, j], axis=tap.axis) * tap.weight[:, j].astype(y.dtype).reshape(along)
        total = term if total is None else np.add(total, term, out=total)
    return total


def _to_dtype(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Back to the input's dtype: integers round half to even and saturate (as the ONNX reference)."""
    if y.dtype == dtype:
        return y
    bounds = saturation(dtype.name)
    return (y if bounds is None else np.clip(np.rint(y), *bounds)).astype(dtype)


# -- PyTorch (the GPU path) ---------------------------------------------------------------------------------------
def resize_torch(node: Node, opset: int) -> Fn:
    spec, cache = resize_spec(node, opset), DeviceCache()

    def run(x: Any, *rest: Any) -> Any:
        key = taps_key(tuple(x.shape), *(to_host(r) for r in split_inputs(spec, rest)))
        _, taps = axis_taps(spec, key)
        moved = cache.get_or_move(
            key, lambda: (outside_mask(taps, x.dim()), *(a for t in taps for a in (t.index, t.weight))), x.device
        )
        mask, *arrays = moved
        y = x.to(torch_dtype(working_dtype(taps, dtype_name(x))))
        for tap, index, weight in zip(taps, arrays[::2], arrays[1::2]):
            y = _interpolate(y, tap.axis, index, weight)
        if mask is not None:
            y = torch.where(mask, torch.tensor(spec.extrapolation, dtype=y.dtype, device=y.device), y)
        if y.dtype == x.dtype:
            return y
        bounds = saturation(dtype_name(x))
        return (y if bounds is None else torch.clamp(torch.round(y), *bounds)).to(x.dtype)

    return run


def _interpolate(y: Any, axis: int, index: Any, weight: Any) -> Any:
    """One axis of a resize: output i is the sum over taps j of y[index[i, j]] * weight[i, j] (one tap
    and no weights: nearest)."""
    if weight is None:
        return y.index_select(axis, index[:, 0])
    along = (-1,) + (1,) * (y.dim() - axis - 1)
    weight = weight.to(y.dtype)
    total = None
    for j in range(index.shape[1]):
        term = y.index_select(axis, index[:, j]) * weight[:, j].reshape(along)
        total = term if total is None else total.add_(term)
    return total


# -- the records ------------------------------------------------------------------------------------------------
def upsample_7(node: Node, ctx: LoadContext) -> None:
    """Upsample-7's `scales` attribute, and experimental Upsample-1's height_scale and width_scale on an
    NCHW input with mode 'bilinear', -> Upsample-9's scales input (mode 'nearest' or 'linear')."""
    if ctx.graph.opset >= 9:
        return
    scales = node.attrs.pop("scales", None)
    if scales is None:
        height, width = node.attrs.pop("height_scale", None), node.attrs.pop("width_scale", None)
        if height is None or width is None:
            raise GraphError(f"{node.describe()}: Upsample before opset 9 needs 'scales' (or height_scale and "
                             "width_scale)")  # fmt: skip
        scales = [1.0, 1.0, height, width]
    if node.attrs.get("mode") == "bilinear":
        node.attrs["mode"] = "linear"
    node.inputs = [node.inputs[0], ctx.graph.add_constant(f"{node.name}_scales", np.array(scales, np.float32))]


def check_resize(node: Node, ctx: LoadContext) -> None:
    resize_spec(node, ctx.graph.opset)


def resize_numpy(node: Node, opset: int) -> Fn:
    spec = resize_spec(node, opset)
    return lambda x, *rest: resize(spec, x, *rest)


def resize_size(node: Node, args: list, opset: int) -> tuple[tuple[int, ...], int]:
    spec = resize_spec(node, opset)
    x, *rest = args
    _, scales, sizes = split_inputs(spec, tuple(rest))
    return _output_shape(spec, tuple(x.shape), _floats(to_host(scales)), _ints(to_host(sizes))), max(itemsize(x), 4)


def _output_shape(spec: ResizeSpec, shape: tuple, scales: tuple | None, sizes: tuple | None) -> tuple:
    """The output shape alone (no taps: those would be as long as the axes)."""
    axes = _axes(spec, len(shape))
    if (scales is None) == (sizes is None) or len(scales or sizes) != len(axes):
        return shape  # the op's own error says what is wrong
    out_sizes, _ = _sizes_and_scales(spec, shape, axes, scales, sizes)
    out = list(shape)
    for axis, n in zip(axes, out_sizes):
        out[axis] = n
    return tuple(out)


op("Resize", resize_numpy, resize_torch, shape_inputs=(1, 2, 3), check=check_resize, size=resize_size)
op("Upsample", resize_numpy, resize_torch, shape_inputs=(1,), upgrade=upsample_7, check=check_resize, size=resize_size)
