"""Which graph nodes run as xpuruntime ops (through the selector) and with which arguments.

`lower(node, args, opset)` returns `(op, positions, attrs)` for the dispatcher (positions: for each of the
op's inputs, the index of the node input that feeds it, or None), or None when the node runs as a function
of its op record (shape ops, integer math, or a case the xrt op does not cover). An ONNX op's lowering is
part of its record (`OpRecord.lower`); nodes in domain 'xrt' (made by the fusion passes) are calls of the
op of that name.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..graph.ir import Node
from .ops import OPS
from .ops.record import Lowered

XRT_DOMAIN = "xrt"


def flattens(node: Node, args: list) -> bool:
    """MatMul of a contiguous (..., K) activation by a 2-D weight runs as ONE (M, K) x (K, N) GEMM on
    flattened views (numpy would otherwise loop over the leading dims)."""
    if node.op != "MatMul" or node.domain or len(args) != 2:
        return False
    a, b = args
    contiguous = a.flags.c_contiguous if isinstance(a, np.ndarray) else bool(getattr(a, "is_contiguous", bool)())
    return getattr(a, "ndim", 0) >= 3 and getattr(b, "ndim", 0) == 2 and contiguous


def lower(node: Node, args: list[Any], opset: int) -> Lowered | None:
    """The xrt op call for `node` with these argument arrays, or None (run it with its record's function)."""
    if node.domain == XRT_DOMAIN:
        return node.op, tuple(i if name else None for i, name in enumerate(node.inputs)), dict(node.attrs)
    rule = OPS[node.op].lower if not node.domain else None
    return None if rule is None else rule(node, args, opset)
