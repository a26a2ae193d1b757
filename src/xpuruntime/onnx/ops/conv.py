"""Convolutions: Conv and ConvTranspose in 1, 2 and 3 spatial dims, with groups, dilations, strides, pads and
auto_pad, and a bias; Col2Im (ConvTranspose's scatter of blocks) and DeformConv (taps moved by offsets).

On the CPU they run through PyTorch's CPU kernels when PyTorch is installed (`CPU_TORCH`), else as im2col +
one batched BLAS matmul per group (Conv) or a matmul + col2im scatter (ConvTranspose) in NumPy; the GPU path
runs PyTorch's convolutions (cuDNN). Asymmetric pads are applied before the convolution, so every backend
sees padding 0.
"""

from __future__ import annotations

import importlib.util
import itertools
import math
from typing import Any

import numpy as np

from ...errors import ShapeError
from ...graph.ir import Node
from .record import F, Fn, ints, itemsize, on_host, op, torch
from .window import Window, check_auto_pad, numpy_windows, torch_pad_widths, window

CPU_TORCH = importlib.util.find_spec("torch") is not None  # the CPU path's fast kernels (tests turn it off)
CHANNELS_LAST_DEVICES = ("cuda",)  # where the GPU path convolves 2-D in channels-last (tests add "cpu")
CHANNELS_LAST_DTYPES = ("float16", "bfloat16", "float32")  # cuDNN's tensor-core (TF32 for float32) NHWC kernels


def _check_shapes(node: Node, x: Any, w: Any, group: int, channels_in_w: int) -> None:
    if len(x.shape) < 3 or len(w.shape) != len(x.shape):
        raise ShapeError(f"{node.op}: X {tuple(x.shape)} and W {tuple(w.shape)} need the same rank, 3 or more")
    if group < 1 or x.shape[1] % group or x.shape[1] != channels_in_w:
        raise ShapeError(
            f"{node.op}: X has {x.shape[1]} channels, W {tuple(w.shape)} with group={group} expects {channels_in_w}"
        )


def _torch_conv(rank: int) -> Any:
    return (F.conv1d, F.conv2d, F.conv3d)[rank - 1] if 1 <= rank <= 3 else None


# -- Conv ---------------------------------------------------------------------------------------------------------
def conv_window(node: Node, x: Any, w: Any) -> tuple[Window, int]:
    group = int(node.attrs.get("group", 1))
    _check_shapes(node, x, w, group, w.shape[1] * group)
    if w.shape[0] % group:
        raise ShapeError(f"Conv: W's {w.shape[0]} output channels do not split into group={group}")
    return window(node, tuple(x.shape[2:]), tuple(w.shape[2:])), group


def conv_im2col(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, win: Window, group: int) -> np.ndarray:
    """Conv in NumPy: the padded input's windows copied into columns, one (N*out, C/g*k) @ (C/g*k, M/g) matmul
    per group (batched)."""
    n, c = x.shape[:2]
    m, rank = w.shape[0], len(win.out)
    padded = np.pad(x, [(0, 0), (0, 0), *win.widths()])
    cols = numpy_windows(padded, win).reshape(n, group, c // group, *win.out, *win.kernel)
    spatial = tuple(range(3, 3 + rank))
    cols = cols.transpose(1, 0, *spatial, 2, *(r + rank for r in spatial))
    cols = cols.reshape(group, n * math.prod(win.out), -1)
    weights = w.reshape(group, m // group, -1).transpose(0, 2, 1)
    y = np.matmul(cols, weights).reshape(group, n, *win.out, m // group)
    y = y.transpose(1, 0, rank + 2, *range(2, rank + 2)).reshape(n, m, *win.out)
    return y if b is None else y + b.reshape(m, *(1,) * rank)


def conv_with_torch(x: Any, w: Any, b: Any, win: Window, group: int) -> Any:
    """Conv with PyTorch (tensors in, tensor out): F.convNd (cuDNN on a GPU) with its own padding where the pads
    are symmetric, else after padding the input (a copy of it: on the CPU that was a tenth of MobileNetV3's run)."""
    fn = _torch_conv(len(win.out))
    if fn is None:
        raise ShapeError(f"Conv: {len(win.out)} spatial dims; the GPU path convolves 1 to 3")
    widths = win.widths()
    if all(begin == end for begin, end in widths):
        return fn(x, w, b, win.strides, [begin for begin, _ in widths], win.dilations, group)
    return fn(F.pad(x, torch_pad_widths(widths)), w, b, win.strides, 0, win.dilations, group)


class _CpuTorch:
    """Runs a PyTorch function on NumPy arrays (float16 in float32: PyTorch's CPU kernels lack most of it). An
    array PyTorch cannot share (read-only, as initializers are, or strided, or of another dtype) is copied once
    and the copy kept while the same array comes back (the weights, run after run)."""

    def __init__(self) -> None:
        self._copies: dict[int, tuple[np.ndarray, Any]] = {}

    def __call__(self, fn: Any, *arrays: np.ndarray | None) -> np.ndarray:
        dtype = arrays[0].dtype
        work = np.dtype(np.float32) if dtype == np.float16 else dtype
        tensors = [None if a is None else self._tensor(position, a, work) for position, a in enumerate(arrays)]
        with torch.no_grad():
            return fn(*tensors).numpy().astype(dtype, copy=False)

    def _tensor(self, position: int, a: np.ndarray, work: np.dtype) -> Any:
        if a.flags.writeable and a.flags.c_contiguous and a.dtype == work:
            return torch.from_numpy(a)
        kept = self._copies.get(position)
        if kept is None or kept[0] is not a:
            kept = self._copies[position] = (a, torch.from_numpy(np.array(a, work, order="C")))
        return kept[1]


# FusedConv (graph/passes/conv_activation_fusion) is a Conv whose activation runs in place on its output (after
# adding its optional fourth input Z, as onnxruntime's com.microsoft.FusedConv)
def activate_in_place(y: Any, activation: str | None, params: list[float]) -> Any:
    """The activation applied in place to a fresh convolution output (a tensor); None: none."""
    if activation is None:
        return y
    if activation == "Relu":
        return y.relu_()
    if activation == "LeakyRelu":
        return F.leaky_relu_(y, params[0])
    if activation == "Sigmoid":
        return y.sigmoid_()
    if activation == "Tanh":
        return y.tanh_()
    if activation == "HardSwish":
        return F.hardswish(y, inplace=True)
    if activation == "HardSigmoid":
        return y.mul_(params[0]).add_(params[1]).clamp_(0.0, 1.0)
    return y.clamp_(params[0], params[1])  # Clip


def _activate_numpy(y: np.ndarray, activation: str | None, params: list[float]) -> np.ndarray:
    """The same in NumPy, in place (ONNX's formulas)."""
    one = y.dtype.type
    if activation is None:
        pass
    elif activation == "Relu":
        np.maximum(y, 0, out=y)
    elif activation == "LeakyRelu":
        np.copyto(y, np.where(y < 0, y * one(params[0]), y))
    elif activation == "Sigmoid":
        np.copyto(y, 1 / (1 + np.exp(-y)))
    elif activation == "Tanh":
        np.tanh(y, out=y)
    elif activation == "HardSwish":
        np.multiply(y, np.clip(y / one(6) + one(0.5), 0, 1), out=y)
    elif activation == "HardSigmoid":
        np.clip(y * one(params[0]) + one(params[1]), 0, 1, out=y)
    else:  # Clip
        np.clip(y, params[0], params[1], out=y)
    return y


def _activation_of(node: Node) -> tuple[str | None, list[float]]:
    """A FusedConv's (activation, its parameters); (None, []) for a plain Conv."""
    activation = node.attrs.get("activation")
    params = [float(p) for p in node.attrs.get("activation_params", ())]
    return (None if activation is None else str(activation)), params


def conv(node: Node, opset: int) -> Fn:
    """Conv, or FusedConv: the convolution, then its activation in place."""
    activation, params = _activation_of(node)
    on_cpu_torch = _CpuTorch()

    def run(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None, z: np.ndarray | None = None) -> np.ndarray:
        win, group = conv_window(node, x, w)
        if CPU_TORCH and _torch_conv(len(win.out)) is not None:

            def convolve(xt: Any, wt: Any, bt: Any, zt: Any) -> Any:
                return activate_in_place(_summed(conv_with_torch(xt, wt, bt, win, group), zt), activation, params)

            return on_cpu_torch(convolve, x, w, b, z)
        y = conv_im2col(x.astype(np.float32) if x.dtype == np.float16 else x, w.astype(x.dtype), b, win, group)
        return _activate_numpy(_summed(y, z), activation, params).astype(x.dtype, copy=False)

    return run


def wants_channels_last(t: Any) -> bool:
    """Whether the GPU path keeps this 4-D tensor (an image batch, a 2-D convolution's weight) channels-last.

    cuDNN's fast tensor-core convolutions (half precision, and float32 as TF32, PyTorch's default for cuDNN) are
    NHWC: given NCHW tensors it transposes the input, the weight and the output around every call (inductor makes
    convolutional graphs channels-last for this reason). On an H200, zoo ResNet-50 against
    torch.compile(mode="reduce-overhead"): fp16 B64 0.56x NCHW -> 1.04x, fp32 B64 0.64x -> 1.13x (with the fused
    Relu and residual forms below). So the convolution's input is made channels-last (once: the output of a
    channels-last convolution is channels-last, and elementwise kernel steps keep the layout, see
    `lowering.in_channels_last`) and its constant weight is moved to the device in that layout
    (`OpRecord.channels_last_inputs`)."""
    return (
        t.ndim == 4
        and t.device.type in CHANNELS_LAST_DEVICES
        and str(t.dtype).removeprefix("torch.") in CHANNELS_LAST_DTYPES
    )


def _summed(y: Any, z: Any = None) -> Any:
    """A FusedConv's fourth input Z (a residual, `graph.passes.conv_activation_fusion`) added, in place where Z
    has the output's shape (else by ONNX's broadcasting: the pass fuses shapes that are equal only at run time)."""
    if z is None:
        return y
    if tuple(z.shape) != tuple(y.shape):
        return y + z
    y += z
    return y


def _cudnn_conv_relu(x: Any, w: Any, b: Any, z: Any, win: Window, group: int) -> Any:
    """relu(conv(x) + b (+ z)) as one cuDNN kernel (bias, residual and Relu in its epilogue): F.conv2d, an Add and
    an in-place Relu make three or four passes over the output (convolution, bias, residual, Relu). Not for
    grouped convolutions: with MobileNetV3's depthwise ones the fused call took its B64 fp16 run from 1.94 to
    3.82 ms on an H200."""
    pads = [begin for begin, _ in win.widths()]
    if z is None:
        return torch.ops.aten.cudnn_convolution_relu(x, w, b, win.strides, pads, win.dilations, group)
    if tuple(z.shape) != (x.shape[0], w.shape[0], *win.out):  # Z broadcast: the Add as ONNX does it
        return activate_in_place(_summed(conv_with_torch(x, w, b, win, group), z), "Relu", [])
    z = z.contiguous(memory_format=torch.channels_last)
    return torch.ops.aten.cudnn_convolution_add_relu(x, w, z, 1.0, b, win.strides, pads, win.dilations, group)


def conv_torch(node: Node, opset: int) -> Fn:
    activation, params = _activation_of(node)

    def run(x: Any, w: Any, b: Any = None, z: Any = None) -> Any:
        win, group = conv_window(node, x, w)
        if wants_channels_last(x):
            x = x.contiguous(memory_format=torch.channels_last)
            symmetric = all(begin == end for begin, end in win.widths())
            if activation == "Relu" and group == 1 and x.is_cuda and symmetric:
                return _cudnn_conv_relu(x, w, b, z, win, group)
        return activate_in_place(_summed(conv_with_torch(x, w, b, win, group), z), activation, params)

    return run


op("Conv", conv, conv_torch, check=check_auto_pad, channels_last_inputs=frozenset({1}))
op("FusedConv", conv, conv_torch, check=check_auto_pad, channels_last_inputs=frozenset({1}))


# -- ConvTranspose --------------------------------------------------------------------------------------------------
def transpose_geometry(node: Node, x: Any, w: Any) -> tuple[dict, int]:
    """ConvTranspose's strides, dilations, output_padding and pads (begin, end) for this input, and its group."""
    group = int(node.attrs.get("group", 1))
    _check_shapes(node, x, w, group, w.shape[0])
    spatial, kernel = tuple(x.shape[2:]), tuple(w.shape[2:])
    n = len(spatial)
    at = node.attrs
    strides = list(at.get("strides") or [1] * n)
    dilations = list(at.get("dilations") or [1] * n)
    extra = list(at.get("output_padding") or [0] * n)[:n]
    full = [s * (i - 1) + e + (k - 1) * d + 1 for s, i, e, k, d in zip(strides, spatial, extra, kernel, dilations)]
    auto, shape = at.get("auto_pad", "NOTSET"), at.get("output_shape")
    if shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        wanted = list(shape)[-n:] if shape is not None else [i * s for i, s in zip(spatial, strides)]
        total = [f - o for f, o in zip(full, wanted)]
        if shape is None:  # auto_pad alone never pads negatively (onnxruntime): the output may stay smaller
            total = [max(t, 0) for t in total]
        half = [t // 2 for t in total]
        begin = half if auto == "SAME_UPPER" else [t - h for t, h in zip(total, half)]
        end = [t - b for t, b in zip(total, begin)]
    elif auto == "VALID":
        begin, end = [0] * n, [0] * n
    else:
        pads = list(at.get("pads") or [0] * (2 * n))
        begin, end = pads[:n], pads[n:]
    if any(f - b - e < 1 for f, b, e in zip(full, begin, end)):
        raise ShapeError(f"ConvTranspose: pads {begin} / {end} leave nothing of an output of {full}")
    lead = [max(-b, 0) for b in begin]  # an output_shape larger than the full output: zeros around it
    extra = [x + max(-e, 0) for x, e in zip(extra, end)]
    begin, end = [max(b, 0) for b in begin], [max(e, 0) for e in end]
    geometry = {"strides": strides, "dilations": dilations, "extra": extra, "lead": lead, "begin": begin, "end": end}
    return geometry, group


def _crop(y: Any, geometry: dict) -> Any:
    """The output cropped by the pads."""
    index = [slice(None), slice(None)]
    for size, b, e in zip(y.shape[2:], geometry["begin"], geometry["end"]):
        index.append(slice(b, size - e))
    return y[tuple(index)]


def conv_transpose_numpy(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, geometry: dict, group: int) -> np.ndarray:
    """ConvTranspose in NumPy: one matmul per group gives every kernel tap's contribution; each tap is added into
    the output at its dilated offset, every stride-th cell (col2im)."""
    n, c = x.shape[:2]
    spatial, kernel = x.shape[2:], w.shape[2:]
    mg = w.shape[1]
    strides, dilations, extra = geometry["strides"], geometry["dilations"], geometry["extra"]
    cols = np.einsum(
        "ngci,gcm->ngmi", x.reshape(n, group, c // group, -1), w.reshape(group, c // group, -1), optimize=True
    ).reshape(n, group * mg, *kernel, *spatial)
    full = [s * (i - 1) + e + (k - 1) * d + 1 for s, i, e, k, d in zip(strides, spatial, extra, kernel, dilations)]
    y = np.zeros((n, group * mg, *full), x.dtype)
    for tap in itertools.product(*(range(k) for k in kernel)):
        index = tuple(slice(t * d, t * d + (i - 1) * s + 1, s) for t, d, i, s in zip(tap, dilations, spatial, strides))
        y[(slice(None), slice(None), *index)] += cols[(slice(None), slice(None), *tap)]
    y = _crop(np.pad(y, [(0, 0), (0, 0), *((lead, 0) for lead in geometry["lead"])]), geometry)
    return y if b is None else y + b.reshape(-1, *(1,) * len(spatial))


def conv_transpose_with_torch(x: Any, w: Any, b: Any, geometry: dict, group: int) -> Any:
    """ConvTranspose with PyTorch: the full output (no pads, no output_padding), then those applied."""
    rank = len(x.shape) - 2
    fn = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[rank - 1]
    y = fn(x, w, None, geometry["strides"], 0, 0, group, geometry["dilations"])
    y = F.pad(y, torch_pad_widths(list(zip(geometry["lead"], geometry["extra"]))))
    y = _crop(y, geometry)
    return y if b is None else y + b.reshape(-1, *(1,) * rank)


def conv_transpose(node: Node, opset: int) -> Fn:
    on_cpu_torch = _CpuTorch()

    def run(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        geometry, group = transpose_geometry(node, x, w)
        if CPU_TORCH and 1 <= x.ndim - 2 <= 3:
            return on_cpu_torch(lambda *t: conv_transpose_with_torch(*t, geometry, group), x, w, b)
        work = x.astype(np.float32) if x.dtype == np.float16 else x
        return conv_transpose_numpy(work, w.astype(work.dtype), b, geometry, group).astype(x.dtype, copy=False)

    return run


def conv_transpose_torch(node: Node, opset: int) -> Fn:
    def run(x: Any, w: Any, b: Any = None) -> Any:
        geometry, group = transpose_geometry(node, x, w)
        return conv_transpose_with_torch(x, w, b, geometry, group)

    return run


def conv_transpose_size(node: Node, args: list, opset: int) -> tuple[tuple[int, ...], int]:
    x, w, *_ = args
    geometry, group = transpose_geometry(node, x, w)
    full = [
        s * (i - 1) + e + (k - 1) * d + 1 + lead - b - end
        for s, i, e, k, d, lead, b, end in zip(
            geometry["strides"], x.shape[2:], geometry["extra"], w.shape[2:], geometry["dilations"],
            geometry["lead"], geometry["begin"], geometry["end"],
        )
    ]  # fmt: skip
    return (x.shape[0], w.shape[1] * group, *full), itemsize(x)


op("ConvTranspose", conv_transpose, conv_transpose_torch, check=check_auto_pad, size=conv_transpose_size)


# -- Col2Im -----------------------------------------------------------------------------------------------------------
def col2im_window(node: Node, shape: tuple[int, ...], image: Any, block: Any) -> tuple[Window, list[int], int]:
    """The sliding window of Col2Im's blocks over the (padded) image, the image dims and the channel count."""
    dims, kernel = ints(image), ints(block)
    if len(shape) != 3 or len(dims) != len(kernel) or not dims or any(k < 1 for k in kernel):
        raise ShapeError(f"Col2Im: input {tuple(shape)} must be (N, C * prod(block), L) and image_shape {dims} / "
                         f"block_shape {kernel} of one length")  # fmt: skip
    win = window(node, tuple(dims), tuple(kernel))
    per_block = math.prod(kernel)
    if shape[1] % per_block or shape[2] != math.prod(win.out):
        raise ShapeError(f"Col2Im: input {tuple(shape)} must hold C * {per_block} rows and {math.prod(win.out)} "
                         f"blocks (the sliding positions of {kernel} over {dims})")  # fmt: skip
    return win, dims, shape[1] // per_block


def col2im(node: Node, opset: int) -> Fn:
    """Each block's values added back where the block sits in the padded image, then the pads cut off."""

    def run(cols: np.ndarray, image: Any, block: Any) -> np.ndarray:
        win, dims, channels = col2im_window(node, cols.shape, image, block)
        work = cols.astype(np.float32) if cols.dtype == np.float16 else cols
        blocks = work.reshape(cols.shape[0], channels, *win.kernel, *win.out)
        padded = [d + b + e for d, b, e in zip(dims, win.begin, win.end)]
        y = np.zeros((cols.shape[0], channels, *padded), work.dtype)
        for tap in itertools.product(*(range(k) for k in win.kernel)):
            index = tuple(slice(t * d, t * d + (o - 1) * s + 1, s)
                          for t, d, o, s in zip(tap, win.dilations, win.out, win.strides))  # fmt: skip
            y[(slice(None), slice(None), *index)] += blocks[(slice(None), slice(None), *tap)]
        crop = tuple(slice(b, b + d) for b, d in zip(win.begin, dims))
        return y[(slice(None), slice(None), *crop)].astype(cols.dtype)

    return run


def col2im_torch(node: Node, opset: int) -> Fn:
    """F.fold for 2-D images; host copies for other ranks."""
    host = on_host(col2im)(node, opset)

    def run(cols: Any, image: Any, block: Any) -> Any:
        win, dims, _ = col2im_window(node, tuple(cols.shape), image, block)
        if len(dims) != 2 or win.begin != win.end:
            return host(cols, image, block)
        return F.fold(cols, dims, win.kernel, dilation=win.dilations, padding=win.begin, stride=win.strides)

    return run


def col2im_size(node: Node, args: list, opset: int) -> tuple[tuple[int, ...], int]:
    _, dims, channels = col2im_window(node, tuple(args[0].shape), args[1], args[2])
    return (args[0].shape[0], channels, *dims), itemsize(args[0])


op("Col2Im", col2im, col2im_torch, shape_inputs=(1, 2), size=col2im_size)


# -- DeformConv -------------------------------------------------------------------------------------------------------
def _tap_positions(win: Window) -> np.ndarray:
    """Where each kernel tap of each output position reads the unpadded input before its offset:
    (rank, taps, positions)."""
    rank = len(win.out)
    grid = np.stack(np.meshgrid(*(np.arange(o) for o in win.out), indexing="ij")).reshape(rank, 1, -1)
    kernel = np.stack(np.meshgrid(*(np.arange(k) for k in win.kernel), indexing="ij")).reshape(rank, -1, 1)
    column = lambda values: np.array(values).reshape(rank, 1, 1)  # noqa: E731
    return grid * column(win.strides) - column(win.begin) + kernel * column(win.dilations)


def _bilinear(flat: np.ndarray, at: np.ndarray, spatial: list[int]) -> np.ndarray:
    """flat (N, G, C, prod(spatial)) read at the points `at` (N, G, rank, P), each the blend of its 2^rank
    neighbours (0 outside the input): (N, G, C, P)."""
    rank = at.shape[2]
    size = np.array(spatial).reshape(1, 1, rank, 1)
    low = np.floor(at).astype(np.int64)
    out = np.zeros((*flat.shape[:3], at.shape[3]))
    for corner in itertools.product((0, 1), repeat=rank):
        index = low + np.array(corner).reshape(1, 1, rank, 1)
        weight = np.prod(1 - np.abs(at - index), axis=2) * np.all((index >= 0) & (index < size), axis=2)
        where = np.ravel_multi_index(tuple(np.moveaxis(np.clip(index, 0, size - 1), 2, 0)), spatial)
        out += np.take_along_axis(flat, where[:, :, None, :], axis=3) * weight[:, :, None, :]
    return out


def deform_conv(node: Node, opset: int) -> Fn:
    """Each kernel tap reads the input at its place in the window moved by its offset (bilinear, 0 outside),
    scaled by its mask; the taps then meet the weights in one matmul per group, as Conv's columns do."""
    offset_groups = int(node.attrs.get("offset_group", 1))

    def run(x: np.ndarray, w: np.ndarray, offset: np.ndarray, b: Any = None, mask: Any = None) -> np.ndarray:
        win, group = conv_window(node, x, w)
        n, c, *spatial = x.shape
        rank, taps, positions = len(spatial), math.prod(win.kernel), math.prod(win.out)
        if c % offset_groups or offset.shape != (n, offset_groups * taps * rank, *win.out):
            raise ShapeError(f"DeformConv: offset {offset.shape} must be {(n, offset_groups * taps * rank, *win.out)} "
                             f"and the {c} channels divisible by offset_group {offset_groups}")  # fmt: skip
        if mask is not None and mask.shape != (n, offset_groups * taps, *win.out):
            raise ShapeError(f"DeformConv: mask {mask.shape} must be {(n, offset_groups * taps, *win.out)}")
        moves = offset.astype(np.float64).reshape(n, offset_groups, taps, rank, positions).swapaxes(2, 3)
        at = (_tap_positions(win)[None, None] + moves).reshape(n, offset_groups, rank, taps * positions)
        flat = x.astype(np.float64).reshape(n, offset_groups, c // offset_groups, -1)
        cols = _bilinear(flat, at, spatial)
        if mask is not None:
            cols *= mask.astype(np.float64).reshape(n, offset_groups, 1, -1)
        cols = cols.reshape(n, group, (c // group) * taps, positions)
        y = np.einsum("gmk,ngkp->ngmp", w.astype(np.float64).reshape(group, w.shape[0] // group, -1), cols)
        y = y.reshape(n, w.shape[0], *win.out)
        return (y if b is None else y + b.reshape(-1, *(1,) * rank)).astype(x.dtype)

    return run


op("DeformConv", deform_conv, check=check_auto_pad)
