"""Window functions (HannWindow, HammingWindow, BlackmanWindow: symmetric or periodic) and small transformer
pieces that are ops of their own in recent opsets: RotaryEmbedding, SwiGLU; plus Det and Unique. NumPy
functions (the GPU path runs them on the host), except SwiGLU's."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import ShapeError
from ...graph.ir import Node
from ..dtypes import dtype_name
from .record import Fn, op, scalar, torch


def _window(coefficients: tuple[float, ...]) -> Any:
    """A cosine-sum window: w[n] = sum_k (-1)^k a_k cos(2 pi k n / N), N the size (periodic) or size - 1."""

    def build(node: Node, opset: int) -> Fn:
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


op("Unique", unique, tuple_output=True, shape_inputs=(0,))  # its output shapes follow its values


def dft(node: Node, opset: int) -> Fn:
    """DFT-17 (axis an attribute, default 1) and DFT-20 (axis an input, default -2) over a signal whose last dim
    holds the real part, or real and imaginary parts; onesided keeps (or, inverse, takes) half the spectrum."""
    inverse, onesided = bool(node.attrs.get("inverse", 0)), bool(node.attrs.get("onesided", 0))

    def run(x: np.ndarray, length: Any = None, axis: Any = None) -> np.ndarray:
        if opset >= 20:
            ax = -2 if axis is None or np.size(axis) == 0 else int(scalar(axis))
        else:
            ax = int(node.attrs.get("axis", 1))
        ax = ax % x.ndim
        if ax == x.ndim - 1 or x.shape[-1] not in (1, 2):
            raise ShapeError(f"DFT: axis {ax} of a signal of shape {x.shape} (last dim 1 or 2, not the axis)")
        signal = x[..., 0] + (1j * x[..., 1] if x.shape[-1] == 2 else 0)
        given = length is not None and np.size(length) > 0
        n = int(scalar(length)) if given else 2 * (x.shape[ax] - 1) if inverse and onesided else x.shape[ax]
        if inverse and onesided:
            return np.fft.irfft(signal, n=n, axis=ax)[..., None].astype(x.dtype)
        result = np.fft.ifft(signal, n=n, axis=ax) if inverse else np.fft.fft(signal, n=n, axis=ax)
        if onesided:
            result = np.take(result, np.arange(result.shape[ax] // 2 + 1), axis=ax)
        return np.stack([result.real, result.imag], axis=-1).astype(x.dtype)

    return run


op("DFT", dft, shape_inputs=(1, 2))


def _corners(boxes: np.ndarray, center: bool) -> np.ndarray:
    """(…, 4) boxes as (y1, x1, y2, x2) with y1 <= y2 and x1 <= x2."""
    if center:
        x, y, w, h = (boxes[..., i] for i in range(4))
        return np.stack([y - h / 2, x - w / 2, y + h / 2, x + w / 2], axis=-1)
    y1, x1, y2, x2 = (boxes[..., i] for i in range(4))
    return np.stack([np.minimum(y1, y2), np.minimum(x1, x2), np.maximum(y1, y2), np.maximum(x1, x2)], axis=-1)


def _iou(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    top, left = np.maximum(box[0], others[:, 0]), np.maximum(box[1], others[:, 1])
    bottom, right = np.minimum(box[2], others[:, 2]), np.minimum(box[3], others[:, 3])
    inter = np.clip(bottom - top, 0, None) * np.clip(right - left, 0, None)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (others[:, 2] - others[:, 0]) * (others[:, 3] - others[:, 1])
    union = area + areas - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0)


def non_max_suppression(node: Node, opset: int) -> Fn:
    """Greedy per batch and class: boxes by descending score (ties in index order) above score_threshold, each
    kept unless its IoU with a kept one exceeds iou_threshold, at most max_output_boxes_per_class."""
    center = bool(node.attrs.get("center_point_box", 0))

    def run(boxes: np.ndarray, scores: np.ndarray, limit: Any = None, iou: Any = None, floor: Any = None) -> Any:
        most = int(scalar(limit)) if limit is not None and np.size(limit) else 0
        iou_max = float(scalar(iou)) if iou is not None and np.size(iou) else 0.0
        corners = _corners(boxes.astype(np.float64), center)
        found = []
        for b in range(scores.shape[0]):
            for c in range(scores.shape[1]):
                s = scores[b, c]
                order = [i for i in np.argsort(-s, kind="stable") if floor is None or not np.size(floor)
                         or s[i] > float(scalar(floor))]  # fmt: skip
                kept: list[int] = []
                for i in order:
                    if len(kept) >= most:
                        break
                    if not kept or np.all(_iou(corners[b, i], corners[b, kept]) <= iou_max):
                        kept.append(int(i))
                found += [(b, c, i) for i in kept]
        return np.array(found, np.int64).reshape(-1, 3)

    return run


op("NonMaxSuppression", non_max_suppression, shape_inputs=(0, 1, 2, 3, 4))
