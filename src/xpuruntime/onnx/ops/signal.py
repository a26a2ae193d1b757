"""Window functions (HannWindow, HammingWindow, BlackmanWindow: symmetric or periodic) and small transformer
pieces that are ops of their own in recent opsets: RotaryEmbedding, SwiGLU; plus Det and Unique. NumPy
functions (the GPU path runs them on the host), except SwiGLU's."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import ShapeError
from ...graph.ir import Node
from .record import Fn, op, scalar, torch


def _window(coefficients: tuple[float, ...]) -> Any:
    """A cosine-sum window: w[n] = sum_k (-1)^k a_k cos(2 pi k n / N), N the size (periodic) or size - 1."""

    def build(node: Node, opset: int) -> Fn:
        from ..importer import dtype_name

        dtype = dtype_name(int(node.attrs.get("output_datatype", 1)))
        periodic = bool(node.attrs.get("periodic", 1))

        def run(size: Any) -> np.ndarray:
            n = int(scalar(size))
            span = n if periodic else n - 1
            positions = np.arange(n, dtype=np.float64)
            total = np.zeros(n)
            for k, a in enumerate(coefficients):
                total += (-1) ** k * a * np.cos(2 * np.pi * k * positions / span) if span else (-1) ** k * a
            return total.astype(dtype)

        return run

    return build


op("HannWindow", _window((0.5, 0.5)), shape_inputs=(0,))
op("HammingWindow", _window((25 / 46, 21 / 46)), shape_inputs=(0,))
op("BlackmanWindow", _window((0.42, 0.5, 0.08)), shape_inputs=(0,))


def rotary_embedding(node: Node, opset: int) -> Fn:
    interleaved = bool(node.attrs.get("interleaved", 0))
    rotary_dim, heads = int(node.attrs.get("rotary_embedding_dim", 0)), node.attrs.get("num_heads")

    def run(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, positions: Any = None) -> np.ndarray:
        shape = x.shape
        if x.ndim == 4:  # (B, heads, S, D) -> (B, S, heads, D)
            x = x.transpose(0, 2, 1, 3)
        elif x.ndim == 3:
            if not heads:
                raise ShapeError("RotaryEmbedding: a 3-D input needs num_heads")
            x = x.reshape(shape[0], shape[1], int(heads), -1)
        else:
            raise ShapeError(f"RotaryEmbedding: expects a 3-D or 4-D input, got {shape}")
        dim = rotary_dim or x.shape[3]
        if positions is not None:
            cos, sin = cos[positions], sin[positions]
        if cos.shape[-1] != dim // 2 or sin.shape[-1] != dim // 2:
            raise ShapeError(f"RotaryEmbedding: cos/sin caches of {cos.shape[-1]} values for a rotary dim of {dim}")
        cos, sin = cos[:, :, None, :], sin[:, :, None, :]
        rotate = x[..., :dim]
        first, second = (rotate[..., 0::2], rotate[..., 1::2]) if interleaved else np.split(rotate, 2, axis=-1)
        real, imag = cos * first - sin * second, sin * first + cos * second
        turned = np.stack((real, imag), -1).reshape(rotate.shape) if interleaved else np.concatenate((real, imag), -1)
        y = np.concatenate((turned, x[..., dim:]), axis=-1).astype(x.dtype)
        return y.reshape(shape) if len(shape) == 3 else y.transpose(0, 2, 1, 3)

    return run


op("RotaryEmbedding", rotary_embedding)


def _swiglu(node: Node, opset: int) -> Fn:
    alpha = float(node.attrs.get("alpha", 1.0))

    def run(a: Any, b: Any) -> Any:
        if tuple(a.shape) != tuple(b.shape):
            raise ShapeError(f"SwiGLU: A {tuple(a.shape)} and B {tuple(b.shape)} must have one shape")
        if isinstance(a, np.ndarray):
            return (a * (1 / (1 + np.exp(-alpha * a))).astype(a.dtype) * b).astype(a.dtype)
        return a * torch.sigmoid(alpha * a) * b

    return run


op("SwiGLU", _swiglu, _swiglu)
op("Det", lambda node, opset: lambda x: np.linalg.det(x).astype(x.dtype))


def unique(node: Node, opset: int) -> Fn:
    axis, keep_sorted = node.attrs.get("axis"), bool(node.attrs.get("sorted", 1))

    def run(x: np.ndarray) -> tuple:
        flat = x if axis is not None else x.reshape(-1)
        ax = 0 if axis is None else axis % x.ndim
        values, first, inverse, counts = np.unique(flat, True, True, True, axis=ax)
        if not keep_sorted:  # in order of first occurrence
            order = np.argsort(first, kind="stable")
            rank = np.empty_like(order)
            rank[order] = np.arange(len(order))
            first, counts, inverse = first[order], counts[order], rank[inverse.reshape(-1)]
            values = np.take(flat, first, axis=ax)
        as_int = [np.asarray(a, np.int64).reshape(-1) for a in (first, inverse, counts)]
        return (values, *as_int)

    return run


op("Unique", unique, tuple_output=True)
