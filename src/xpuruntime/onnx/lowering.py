"""Which graph nodes run as xpuruntime ops (through the selector) and with which arguments.

`lower(node, args, opset)` returns `(op, positions, attrs)` for the dispatcher (positions: for each of the
op's inputs, the index of the node input that feeds it, or None), or None when the node runs as a NumPy
function of the op map (shape ops, integer math, or a case the xrt op does not cover).
Nodes in domain 'xrt' (made by the fusion passes) are calls of the op of that name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..graph.ir import Node

XRT_DOMAIN = "xrt"
KERNEL_FLOATS = frozenset({"float16", "bfloat16", "float32", "float64"})
Lowered = tuple[str, tuple[int | None, ...], dict[str, Any]]


def dtype_name(x: Any) -> str | None:
    """'float32' for a NumPy array or a torch tensor of that dtype; None for anything else."""
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        return None
    return dtype.name if isinstance(dtype, np.dtype) else str(dtype).removeprefix("torch.")


def _is_float(x: Any) -> bool:
    return dtype_name(x) in KERNEL_FLOATS


def _matmul(node: Node, args: list, opset: int) -> Lowered | None:
    a, b = args
    if _is_float(a) and a.dtype == b.dtype and a.ndim >= 1 and b.ndim >= 1:
        return "matmul", (0, 1), {}
    return None


def flattens(node: Node, args: list) -> bool:
    """MatMul of a contiguous (..., K) activation by a 2-D weight runs as ONE (M, K) x (K, N) GEMM on
    flattened views (numpy would otherwise loop over the leading dims)."""
    if node.op != "MatMul" or node.domain or len(args) != 2:
        return False
    a, b = args
    contiguous = a.flags.c_contiguous if isinstance(a, np.ndarray) else bool(getattr(a, "is_contiguous", bool)())
    return getattr(a, "ndim", 0) >= 3 and getattr(b, "ndim", 0) == 2 and contiguous


def _softmax(node: Node, args: list, opset: int) -> Lowered | None:
    (x,) = args
    if opset >= 13 and _is_float(x) and x.ndim >= 1:
        return "softmax", (0,), {"axis": node.attrs.get("axis", -1)}
    return None


def _layer_norm(node: Node, args: list, opset: int) -> Lowered | None:
    if any(node.outputs[1:]):  # Mean / InvStdDev are wanted: only the op map computes them
        return None
    x, scale, *rest = args
    bias = rest[0] if rest else None
    if not _is_float(x) or x.ndim == 0:
        return None
    dims = x.shape[node.attrs.get("axis", -1) % x.ndim :]
    if (
        scale.shape != dims
        or scale.dtype != x.dtype
        or (bias is not None and (bias.shape != dims or bias.dtype != x.dtype))
    ):
        return None
    return (
        "layer_norm",
        (0, 1, 2 if bias is not None else None),
        {"normalized_shape": dims, "eps": float(node.attrs.get("epsilon", 1e-5))},
    )


def _reduce_sum(node: Node, args: list, opset: int) -> Lowered | None:
    x = args[0]
    axes = args[1] if len(args) > 1 else None
    if opset < 13 or not _is_float(x) or x.ndim == 0:
        return None
    raw = [] if axes is None else [int(a) for a in np.asarray(axes).reshape(-1)]  # a host array (static)
    if not raw and node.attrs.get("noop_with_empty_axes", 0):
        return None
    axis = tuple(raw) if raw else None
    return "sum", (0,), {"axis": axis, "keepdims": bool(node.attrs.get("keepdims", 1))}


ONNX_LOWERINGS: dict[str, Callable[[Node, list, int], Lowered | None]] = {
    "MatMul": _matmul,
    "Softmax": _softmax,
    "LayerNormalization": _layer_norm,
    "ReduceSum": _reduce_sum,
}


def lower(node: Node, args: list, opset: int) -> Lowered | None:
    """The xrt op call for `node` with these argument arrays, or None (run it with the op map)."""
    if node.domain == XRT_DOMAIN:
        return node.op, tuple(i if name else None for i, name in enumerate(node.inputs)), dict(node.attrs)
    rule = ONNX_LOWERINGS.get(node.op)
    return None if rule is None else rule(node, args, opset)
