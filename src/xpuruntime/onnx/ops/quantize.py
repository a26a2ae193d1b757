"""Quantization ONNX ops over 8- and 16-bit integers: QuantizeLinear and DequantizeLinear (per tensor, per axis
or blocked scales), DynamicQuantizeLinear, and the integer products MatMulInteger, ConvInteger,
QLinearMatMul and QLinearConv.

Quantizing rounds half to even and saturates to the integer type. The integer products are exact: they run
on float64 (BLAS, or F.conv on the GPU path) where every partial sum of 8- or 16-bit products is an integer
float64 holds exactly, then requantize as onnxruntime does: round((acc) * (a_scale * b_scale / y_scale)) + y_zp.
Float 8, 4 and 2-bit types are not supported (the session does not run those dtypes).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...errors import ShapeError
from ...graph.ir import Node
from ..errors import UnsupportedModelError
from .arrays import NUMPY, builders
from .conv import conv_im2col, conv_window, conv_with_torch
from .record import LoadContext, axis_index, elem_dtype, op
from .window import check_auto_pad

INTEGERS = ("uint8", "int8", "uint16", "int16", "int32")


FLOATS = ("float16", "float32", "float64")


def check_output_dtype(node: Node, ctx: LoadContext) -> None:
    """output_dtype, if set, must be an integer type the session runs (QuantizeLinear) or a float
    (DequantizeLinear)."""
    allowed = INTEGERS[:4] if node.op == "QuantizeLinear" else FLOATS
    try:
        dtype = elem_dtype(node, "output_dtype")
        name = None if dtype is None else dtype.name
    except Exception:
        name = f"element type {node.attrs.get('output_dtype')}"
    if name is not None and name not in allowed:
        raise UnsupportedModelError(f"{node.describe()}: output_dtype {name} is not supported (only {allowed})")


def per_axis(op_name: str, scale: Any, shape: tuple[int, ...], axis: int, block: int) -> Any:
    """A scale or zero point made to broadcast against the input: one value (per tensor), one per entry along
    `axis` (1-D), or one per `block` entries along `axis` (blocked: the input's rank)."""
    if scale.ndim == 0 or (scale.ndim == 1 and scale.shape[0] == 1 and not block):
        return scale.reshape(())
    ax = axis_index(op_name, axis, len(shape))
    if not block:
        if scale.ndim != 1 or scale.shape[0] != shape[ax]:
            raise ShapeError(f"{op_name}: a 1-D scale {tuple(scale.shape)} must hold one value per entry of axis "
                             f"{axis} of {tuple(shape)}")  # fmt: skip
        return scale.reshape([shape[ax] if i == ax else 1 for i in range(len(shape))])
    blocks = -(-shape[ax] // block)
    wanted = tuple(blocks if i == ax else d for i, d in enumerate(shape))
    if tuple(scale.shape) != wanted:
        raise ShapeError(f"{op_name}: a blocked scale {tuple(scale.shape)} must be {wanted} for blocks of {block} "
                         f"along axis {axis} of {tuple(shape)}")  # fmt: skip
    index = [slice(None)] * len(shape)
    index[ax] = np.arange(shape[ax]) // block
    return scale[tuple(index)]


def _bounds(name: str) -> tuple[int, int]:
    info = np.iinfo(name)
    return int(info.min), int(info.max)


def _quantize(xp: Any, node: Node, opset: int, x: Any, scale: Any, zero: Any = None) -> Any:
    """round(x / scale) + zero point, saturated; the division in x's precision (or `precision`'s)."""
    axis, block = node.attrs.get("axis", 1), node.attrs.get("block_size", 0)
    name = _dtype_name(zero.dtype) if zero is not None else elem_dtype(node, "output_dtype", np.dtype(np.uint8)).name
    scale = per_axis("QuantizeLinear", scale, tuple(x.shape), axis, block)
    precision = elem_dtype(node, "precision")
    if precision is not None:
        x, scale = xp.cast(x, xp.dtype(precision.name)), xp.cast(scale, xp.dtype(precision.name))
    q = xp.cast(xp.rint(x / scale), xp.dtype("float64"))
    if zero is not None:
        q = q + xp.cast(per_axis("QuantizeLinear", zero, tuple(x.shape), axis, block), q.dtype)
    lo, hi = _bounds(name)
    return xp.cast(xp.clip(q, lo, hi), xp.dtype(name))


def _dtype_name(dtype: Any) -> str:
    return dtype.name if isinstance(dtype, np.dtype) else str(dtype).removeprefix("torch.")


def _dequantize(xp: Any, node: Node, opset: int, x: Any, scale: Any, zero: Any = None) -> Any:
    axis, block = node.attrs.get("axis", 1), node.attrs.get("block_size", 0)
    out = elem_dtype(node, "output_dtype")
    scale = per_axis("DequantizeLinear", scale, tuple(x.shape), axis, block)
    y = xp.cast(x, xp.dtype("float32"))
    if zero is not None:
        y = y - xp.cast(per_axis("DequantizeLinear", zero, tuple(x.shape), axis, block), y.dtype)
    y = y * scale
    return xp.cast(y, scale.dtype if out is None else xp.dtype(out.name))


op("QuantizeLinear", *builders(_quantize), check=check_output_dtype)
op("DequantizeLinear", *builders(_dequantize), check=check_output_dtype)


def _dynamic_quantize(xp: Any, node: Node, opset: int, x: Any) -> tuple:
    """uint8 with a scale and zero point from the input's range, widened to include 0."""
    wide = xp.cast(x, xp.dtype("float32"))
    low = min(float(wide.min()), 0.0) if math.prod(x.shape) else 0.0
    high = max(float(wide.max()), 0.0) if math.prod(x.shape) else 0.0
    scale = np.float32((high - low) / 255)
    zero = float(np.clip(np.rint(-low / scale), 0, 255)) if scale else 0.0
    # Divide by the scale as an array on x's device: PyTorch's CUDA division by a host scalar multiplies by its
    # reciprocal, which moves quotients near .5 to the other side of the rounding (the node test's -2.5 gave 25).
    scale_array = xp.from_host(np.array(scale, np.float32), x)
    q = xp.rint(wide / scale_array) + zero if scale else wide * 0 + zero
    return xp.cast(xp.clip(q, 0, 255), xp.dtype("uint8")), scale_array, xp.from_host(np.array(zero, np.uint8), x)


op("DynamicQuantizeLinear", *builders(_dynamic_quantize), tuple_output=True)


# -- integer products --------------------------------------------------------------------------------------------
def _centered(xp: Any, x: Any, zero: Any, rows: bool = False) -> Any:
    """x - zero_point in float64 (exact); a 1-D zero point of MatMulInteger's A is per row."""
    wide = xp.cast(x, xp.dtype("float64"))
    if zero is None:
        return wide
    zero = xp.cast(zero, xp.dtype("float64"))
    if rows and zero.ndim == 1 and zero.shape[0] > 1:
        zero = zero.reshape(-1, 1)
    return wide - zero


def _requantize(xp: Any, acc: Any, multiplier: Any, zero: Any, like: Any) -> Any:
    """round(acc * multiplier) + zero point, saturated to the zero point's (else the input's) integer type."""
    name = _dtype_name((zero if zero is not None else like).dtype)
    y = xp.rint(acc * xp.cast(multiplier, acc.dtype))
    if zero is not None:
        y = y + xp.cast(zero, acc.dtype)
    lo, hi = _bounds(name)
    return xp.cast(xp.clip(y, lo, hi), xp.dtype(name))


def _matmul_integer(xp: Any, node: Node, opset: int, a: Any, b: Any, a_zero: Any = None, b_zero: Any = None) -> Any:
    return xp.cast(_centered(xp, a, a_zero, rows=True) @ _centered(xp, b, b_zero), xp.dtype("int32"))


def _qlinear_matmul(xp: Any, node: Node, opset: int, a: Any, a_scale: Any, a_zero: Any, b: Any, b_scale: Any,
                    b_zero: Any, y_scale: Any, y_zero: Any) -> Any:  # fmt: skip
    acc = _centered(xp, a, a_zero) @ _centered(xp, b, b_zero)
    return _requantize(xp, acc, a_scale * b_scale / y_scale, y_zero, a)


op("MatMulInteger", *builders(_matmul_integer))
op("QLinearMatMul", *builders(_qlinear_matmul))


def _conv_accumulate(xp: Any, node: Node, x: Any, w: Any, x_zero: Any, w_zero: Any) -> Any:
    """sum (x - x_zp) * (w - w_zp) over each window, in float64; a 1-D w_zp is per output channel."""
    if w_zero is not None and w_zero.ndim == 1 and w_zero.shape[0] > 1:
        w_zero = w_zero.reshape(-1, *(1,) * (w.ndim - 1))
    xs, ws = _centered(xp, x, x_zero), _centered(xp, w, w_zero)
    win, group = conv_window(node, xs, ws)
    return conv_im2col(xs, ws, None, win, group) if xp is NUMPY else conv_with_torch(xs, ws, None, win, group)


def _conv_integer(xp: Any, node: Node, opset: int, x: Any, w: Any, x_zero: Any = None, w_zero: Any = None) -> Any:
    return xp.cast(_conv_accumulate(xp, node, x, w, x_zero, w_zero), xp.dtype("int32"))


def _qlinear_conv(xp: Any, node: Node, opset: int, x: Any, x_scale: Any, x_zero: Any, w: Any, w_scale: Any, w_zero: Any,
                  y_scale: Any, y_zero: Any, bias: Any = None) -> Any:  # fmt: skip
    acc = _conv_accumulate(xp, node, x, w, x_zero, w_zero)
    rank = acc.ndim - 2
    if bias is not None:
        acc = acc + xp.cast(bias, acc.dtype).reshape(-1, *(1,) * rank)
    multiplier = x_scale * w_scale / y_scale
    if multiplier.ndim == 1 and multiplier.shape[0] > 1:  # per output channel
        multiplier = multiplier.reshape(-1, *(1,) * rank)
    return _requantize(xp, acc, multiplier, y_zero, x)


op("ConvInteger", *builders(_conv_integer), check=check_auto_pad)
op("QLinearConv", *builders(_qlinear_conv), check=check_auto_pad)
