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
from .ops.record import Lowered, torch

XRT_DOMAIN = "xrt"


def flattens(node: Node, args: list) -> bool:
    """MatMul of a contiguous (..., K) activation by a 2-D weight runs as ONE (M, K) x (K, N) GEMM on
    flattened views (numpy would otherwise loop over the leading dims)."""
    if node.op != "MatMul" or node.domain or len(args) != 2:
        return False
    a, b = args
    contiguous = a.flags.c_contiguous if isinstance(a, np.ndarray) else bool(getattr(a, "is_contiguous", bool)())
    return getattr(a, "ndim", 0) >= 3 and getattr(b, "ndim", 0) == 2 and contiguous


def in_channels_last(node: Node, args: list) -> bool:
    """A fused elementwise node whose image-sized inputs are channels-last tensors (the GPU path's convolution
    outputs, see `ops.conv.wants_channels_last`) runs on NHWC views of its inputs (`to_nhwc`), so that its
    output keeps the layout (`from_nhwc`): computed in NCHW order it would read channels-last inputs across
    strides and hand the next convolution a tensor to transpose back."""
    if node.domain != XRT_DOMAIN or node.op != "fused_elementwise":
        return False
    tensors = [a for a in args if a is not None]
    if not tensors or not all(hasattr(a, "is_contiguous") and a.ndim <= 4 for a in tensors):
        return False
    images = [a for a in tensors if a.ndim == 4 and a.shape[1] > 1 and a.shape[2] * a.shape[3] > 1]
    return bool(images) and all(
        a.is_contiguous(memory_format=torch.channels_last) and not a.is_contiguous() for a in images
    )


def to_nhwc(a: Any) -> Any:
    """An (N, C, H, W) tensor (or one that broadcasts to it) viewed as (N, H, W, C)."""
    if a.ndim < 4:
        a = a.reshape((1,) * (4 - a.ndim) + tuple(a.shape))
    return a.permute(0, 2, 3, 1)


def from_nhwc(a: Any) -> Any:
    """An (N, H, W, C) result viewed as the (N, C, H, W) tensor it is: channels-last in memory."""
    return a.permute(0, 3, 1, 2)


def buffer_positions(node: Node, inputs: tuple[str, ...], buffers: frozenset[str]) -> tuple[int, ...]:
    """Where an xrt node's outputs after the first are written: the op's buffer inputs, in the op's order (the
    node (y, h) = add_layer_norm(x, residual, weight, bias) gets h through the op's `residual_out`). Each is
    shaped like the op's first input (`empty_like`)."""
    if node.domain != XRT_DOMAIN or len(node.outputs) < 2:
        return ()
    positions = tuple(i for i, name in enumerate(inputs) if name in buffers)
    if len(positions) < len(node.outputs) - 1:
        raise ValueError(f"{node.describe()}: {len(node.outputs)} outputs, but op '{node.op}' writes only "
                         f"{len(positions) + 1}")  # fmt: skip
    return positions[: len(node.outputs) - 1]


STORED_TRANSPOSED_OPS = ("attention",)  # xrt ops whose kernels write through out's strides (or copy into out)


def stored_order(node: Node, readers: list[Node], graph_outputs: set[str]) -> tuple[int, ...] | None:
    """The order to store a kernel's output in, when its one reader is a Transpose (attention's (B, H, L, D)
    output transposed to (B, L, H, D) and reshaped to (B, L, H*D) for the projection): stored so, the Transpose
    is a contiguous view and the Reshape after it costs nothing, where it was a copy. None: store it as it is."""
    if node.domain != XRT_DOMAIN or node.op not in STORED_TRANSPOSED_OPS or node.outputs[0] in graph_outputs:
        return None
    if len(readers) != 1 or readers[0].op != "Transpose" or readers[0].domain:
        return None
    perm = tuple(readers[0].attrs.get("perm") or ())
    return perm if sorted(perm) == list(range(len(perm))) and perm != tuple(range(len(perm))) else None


def empty_like(a: Any) -> Any:
    """A new contiguous array (tensor) of `a`'s shape, dtype and device."""
    if isinstance(a, np.ndarray):
        return np.empty_like(a, order="C")
    return torch.empty_like(a, memory_format=torch.contiguous_format)


def lower(node: Node, args: list[Any], opset: int) -> Lowered | None:
    """The xrt op call for `node` with these argument arrays, or None (run it with its record's function)."""
    if node.domain == XRT_DOMAIN:
        return node.op, tuple(i if name else None for i, name in enumerate(node.inputs)), dict(node.attrs)
    rule = OPS[node.op].lower if not node.domain else None
    return None if rule is None else rule(node, args, opset)
