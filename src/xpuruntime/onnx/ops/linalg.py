"""Matrix ONNX ops: MatMul (through the selector's matmul kernels), Gemm, Einsum, Trilu, Det."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import ShapeError
from ...graph.ir import Node
from .record import Fn, Lowered, ints, is_float, itemsize, op, torch


def lower_matmul(node: Node, args: list, opset: int) -> Lowered | None:
    a, b = args
    if is_float(a) and a.dtype == b.dtype and a.ndim >= 1 and b.ndim >= 1:
        return "matmul", (0, 1), {}
    return None


def matmul_size(node: Node, args: list, opset: int) -> tuple[tuple[int, ...], int]:
    """MatMul's output: the batch dims broadcast, then (M, N) (1-D operands as NumPy promotes them)."""
    a, b = (tuple(x.shape) for x in args)
    if not a or not b:
        return (), itemsize(args[0])
    a2, b2 = (a if len(a) > 1 else (1, *a)), (b if len(b) > 1 else (*b, 1))
    try:
        batch = tuple(np.broadcast_shapes(a2[:-2], b2[:-2]))
    except ValueError:
        batch = ()
    return (*batch, a2[-2], b2[-1]), itemsize(args[0])


op("MatMul", lambda node, opset: np.matmul, lambda node, opset: torch.matmul, lower=lower_matmul, size=matmul_size)


def gemm(node: Node, opset: int) -> Fn:
    alpha, beta = node.attrs.get("alpha", 1.0), node.attrs.get("beta", 1.0)
    trans_a, trans_b = node.attrs.get("transA", 0), node.attrs.get("transB", 0)

    def run(a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None) -> np.ndarray:
        y = np.matmul(a.T if trans_a else a, b.T if trans_b else b)
        if alpha != 1.0:
            y = y * a.dtype.type(alpha)
        if c is not None:
            y = y + (c if beta == 1.0 else c * a.dtype.type(beta))
        return y.astype(a.dtype, copy=False)

    return run


def gemm_torch(node: Node, opset: int) -> Fn:
    alpha, beta = node.attrs.get("alpha", 1.0), node.attrs.get("beta", 1.0)
    trans_a, trans_b = node.attrs.get("transA", 0), node.attrs.get("transB", 0)

    def run(a: Any, b: Any, c: Any = None) -> Any:
        y = torch.matmul(a.T if trans_a else a, b.T if trans_b else b) * alpha
        return y if c is None else y + beta * c

    return run


op("Gemm", gemm, gemm_torch)


def einsum(node: Node, opset: int) -> Fn:
    equation = node.attrs["equation"].replace(" ", "")
    return lambda *xs: np.asarray(np.einsum(equation, *xs)).astype(xs[0].dtype, copy=False)


def einsum_torch(node: Node, opset: int) -> Fn:
    equation = node.attrs["equation"].replace(" ", "")
    return lambda *xs: torch.einsum(equation, *xs)


op("Einsum", einsum, einsum_torch)


def _diagonal(k: Any) -> int:
    return 0 if k is None else ints(k)[0]


def trilu(node: Node, opset: int) -> Fn:
    upper = bool(node.attrs.get("upper", 1))
    return lambda x, k=None: np.triu(x, _diagonal(k)) if upper else np.tril(x, _diagonal(k))


def trilu_torch(node: Node, opset: int) -> Fn:
    upper = bool(node.attrs.get("upper", 1))
    return lambda x, k=None: torch.triu(x, _diagonal(k)) if upper else torch.tril(x, _diagonal(k))


op("Trilu", trilu, trilu_torch, host_inputs=(1,))


def det(node: Node, opset: int) -> Fn:
    def run(x: np.ndarray) -> np.ndarray:
        if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
            raise ShapeError(f"Det: expected square matrices in the last two dims, got shape {x.shape}")
        return np.linalg.det(x).astype(x.dtype, copy=False)

    return run


def det_torch(node: Node, opset: int) -> Fn:
    def run(x: Any) -> Any:
        if x.dim() < 2 or x.shape[-1] != x.shape[-2]:
            raise ShapeError(f"Det: expected square matrices in the last two dims, got shape {tuple(x.shape)}")
        compute = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype  # no half LU
        return torch.linalg.det(x.to(compute)).to(x.dtype)

    return run


op("Det", det, det_torch)
