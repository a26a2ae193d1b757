"""Integer quantization: QuantizeLinear and DequantizeLinear (per tensor, per axis, blocked), DynamicQuantizeLinear,
QLinearMatMul, MatMulInteger and ConvInteger, for the integer dtypes NumPy holds (8 and 16 bits). Rounding is
half to even and saturates to the target type. NumPy functions (the GPU path runs them on the host)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import ShapeError
from ...graph.ir import Node
from ..dtypes import dtype_name
from .conv import conv_im2col, conv_window
from .record import Fn, op


def _broadcast_param(p: np.ndarray, x_shape: tuple[int, ...], axis: int, block: int) -> np.ndarray:
    """A scale or zero point shaped to broadcast over x: a scalar, one value per `axis` entry, or one per
    block of `block` entries along `axis` (blocked quantization)."""
    p = np.asarray(p)
    if p.size == 1 and p.ndim <= 1:
        return p.reshape(())
    ax = axis % len(x_shape)
    if block:
        return np.repeat(p, block, axis=ax)[tuple(slice(0, n) for n in x_shape)]
    if p.ndim != 1 or p.shape[0] != x_shape[ax]:
        raise ShapeError(f"quantization parameter of shape {p.shape} does not fit axis {axis} of {x_shape}")
    return p.reshape((-1,) + (1,) * (len(x_shape) - ax - 1))


def _target(node: Node, zero_point: Any, default: str = "uint8") -> np.dtype:
    if zero_point is not None:
        return np.asarray(zero_point).dtype
    chosen = node.attrs.get("output_dtype")
    if chosen:
        return np.dtype(dtype_name(int(chosen)))
    return np.dtype(default)


def _saturate(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.clip(np.rint(y), info.min, info.max).astype(dtype)


def quantize_linear(node: Node, opset: int) -> Fn:
    axis, block = int(node.attrs.get("axis", 1)), int(node.attrs.get("block_size", 0))

    def run(x: np.ndarray, scale: np.ndarray, zero_point: Any = None) -> np.ndarray:
        dtype = _target(node, zero_point)
        work = np.float64 if x.dtype == np.float64 else np.float32  # x / scale rounds as ONNX computes it
        s = _broadcast_param(scale, x.shape, axis, block).astype(work)
        zp = 0 if zero_point is None else _broadcast_param(zero_point, x.shape, axis, block).astype(np.float64)
        return _saturate(np.rint(x.astype(work) / s) + zp, dtype)

    return run


def dequantize_linear(node: Node, opset: int) -> Fn:
    axis, block = int(node.attrs.get("axis", 1)), int(node.attrs.get("block_size", 0))

    def run(x: np.ndarray, scale: np.ndarray, zero_point: Any = None) -> np.ndarray:
        s = _broadcast_param(scale, x.shape, axis, block)
        zp = 0 if zero_point is None else _broadcast_param(zero_point, x.shape, axis, block).astype(np.int64)
        out = _target(node, None, scale.dtype.name) if node.attrs.get("output_dtype") else scale.dtype
        return ((x.astype(np.int64) - zp) * s.astype(np.float64)).astype(out)

    return run


op("QuantizeLinear", quantize_linear)
op("DequantizeLinear", dequantize_linear)


def dynamic_quantize_linear(node: Node, opset: int) -> Fn:
    def run(x: np.ndarray) -> tuple:
        """uint8 over [min(x, 0), max(x, 0)]: y = saturate(round(x / scale) + zero point), in float32."""
        low, high = np.float32(min(x.min(initial=0), 0)), np.float32(max(x.max(initial=0), 0))
        scale = (high - low) / np.float32(255)
        if scale == 0:
            return np.zeros(x.shape, np.uint8), np.array(scale, np.float32), np.array(0, np.uint8)
        zero = _saturate(np.asarray(np.rint(-low / scale)), np.dtype(np.uint8))
        y = _saturate(np.rint(x.astype(np.float32) / scale) + zero, np.dtype(np.uint8))
        return y, np.array(scale, np.float32), np.array(zero, np.uint8)

    return run


op("DynamicQuantizeLinear", dynamic_quantize_linear, tuple_output=True)


def _centered(x: np.ndarray, zero_point: Any) -> np.ndarray:
    return x.astype(np.int64) - (0 if zero_point is None else np.asarray(zero_point).astype(np.int64))


def matmul_integer(node: Node, opset: int) -> Fn:
    def run(a: np.ndarray, b: np.ndarray, a_zero: Any = None, b_zero: Any = None) -> np.ndarray:
        a_zero = None if a_zero is None else np.asarray(a_zero).reshape(-1, 1) if np.size(a_zero) > 1 else a_zero
        return np.matmul(_centered(a, a_zero), _centered(b, b_zero)).astype(np.int32)

    return run


def qlinear_matmul(node: Node, opset: int) -> Fn:
    def run(a, a_scale, a_zero, b, b_scale, b_zero, y_scale, y_zero) -> np.ndarray:
        a_real = _centered(a, a_zero.reshape(-1, 1) if np.size(a_zero) > 1 else a_zero) * a_scale.astype(np.float64)
        b_real = _centered(b, b_zero) * b_scale.astype(np.float64)
        return _saturate(np.matmul(a_real, b_real) / y_scale.astype(np.float64) + y_zero, np.asarray(y_zero).dtype)

    return run


def conv_integer(node: Node, opset: int) -> Fn:
    def run(x: np.ndarray, w: np.ndarray, x_zero: Any = None, w_zero: Any = None) -> np.ndarray:
        win, group = conv_window(node, x, w)
        xc = _centered(x, x_zero)
        wz = None if w_zero is None else np.asarray(w_zero).reshape(-1, *(1,) * (w.ndim - 1))
        wc = _centered(w, wz)
        padded_zero = np.pad(xc, [(0, 0), (0, 0), *win.widths()])  # integer zero padding (x - zero point)
        plain = type(win)(win.kernel, win.strides, win.dilations, (0,) * len(win.out), (0,) * len(win.out),
                          (0,) * len(win.out), win.out)  # fmt: skip
        return conv_im2col(padded_zero, wc, None, plain, group).astype(np.int32)

    return run


op("MatMulInteger", matmul_integer)
op("QLinearMatMul", qlinear_matmul)
op("ConvInteger", conv_integer)
