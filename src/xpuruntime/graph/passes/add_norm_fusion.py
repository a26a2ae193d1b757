"""Residual add + norm fusion: a transformer block's new residual stream h = Add(x, residual), read by a
LayerNormalization over the last axis (only its Y output wanted) or by an xrt `rms_norm`, becomes one
`add_layer_norm` / `add_rms_norm` node with two outputs, (y, h): one kernel writes h and the norm of it, where the
graph had an elementwise kernel and a norm kernel (onnxruntime's SkipLayerNormalization). h keeps its other readers
(the next block's residual add, in a pre-norm model); in a post-norm model (BERT) nothing else reads it.

GPU graphs only: there each kernel costs a launch (a few microseconds at batch 1, two a layer here); the CPU's
add-norm kernel is the same two passes over memory as the two nodes. x and residual must have one float dtype
and shapes that may be equal (no broadcasting: a position embedding added to a batch of token embeddings stays
an Add), the norm's weight and bias that dtype and the last dimension's width.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..ir import Graph, Node
from .util import remove

if TYPE_CHECKING:
    from . import PassContext

DEVICES = ("cuda",)
DTYPES = ("float16", "bfloat16", "float32")
RMS_ATTRS = ("eps", "offset", "casting")  # the rms_norm attributes add_rms_norm takes (not normalized_shape)


def _may_be_equal(a: tuple | None, b: tuple | None) -> bool:
    """Whether two shapes can be equal without broadcasting: one rank, known dims equal, and no 1 facing another
    dim (a broadcast). Symbolic dims cannot be compared: shape inference names the same batch and sequence
    length apart after each Add. Where the shapes differ at run time, the node's plan for that input signature
    falls back to the add and the norm in PyTorch (the op refuses a residual of another shape)."""
    if a is None or b is None or len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, int) and isinstance(y, int) and x != y:
            return False
        if (x == 1) != (y == 1):
            return False
    return True


def _norm_params(graph: Graph, norm: Node, width: object, dtype: str) -> bool:
    """The norm's weight (and bias) are constants of shape (width,) in the sum's dtype."""
    for name in norm.inputs[1:]:
        array = graph.constant(name) if name else None
        if name and (array is None or array.shape != (width,) or str(array.dtype) != dtype):
            return False
    return True


def _fusable_norm(graph: Graph, norm: Node, h: str) -> bool:
    """`norm` normalizes h (its first input) over h's last axis alone, and nothing reads its other outputs."""
    shape = graph.value(h).shape
    if not shape or norm.inputs[:1] != [h] or not isinstance(shape[-1], int):
        return False
    if norm.op == "LayerNormalization" and not norm.domain:
        axis = norm.attrs.get("axis", -1)
        last = axis == -1 or axis == len(shape) - 1
        return last and not any(norm.outputs[1:]) and _norm_params(graph, norm, shape[-1], graph.value(h).dtype)
    if norm.op == "rms_norm" and norm.domain == "xrt":
        dims = tuple(norm.attrs.get("normalized_shape") or ())
        return dims == (shape[-1],) and _norm_params(graph, norm, shape[-1], graph.value(h).dtype)
    return False


def _fused(graph: Graph, add: Node, norm: Node) -> Node:
    x, residual = add.inputs
    outputs = [norm.outputs[0], add.outputs[0]]
    if norm.op == "LayerNormalization":
        scale, bias = norm.inputs[1], norm.inputs[2] if len(norm.inputs) > 2 else ""
        attrs = {"eps": float(norm.attrs.get("epsilon", 1e-5))}
        return Node(
            "add_layer_norm", [x, residual, scale, bias], outputs, attrs, graph.fresh_name("AddLayerNorm"), "xrt"
        )
    attrs = {k: v for k, v in norm.attrs.items() if k in RMS_ATTRS}
    return Node("add_rms_norm", [x, residual, norm.inputs[1]], outputs, attrs, graph.fresh_name("AddRMSNorm"), "xrt")


def _match(graph: Graph, add: Node, consumers: dict) -> Node | None:
    """The norm node to fuse with this Add, or None."""
    if add.domain or len(add.inputs) != 2 or add.inputs[0] == add.inputs[1]:
        return None
    (a, b), h = (graph.value(n) for n in add.inputs), graph.value(add.outputs[0])
    if not (a.dtype == b.dtype == h.dtype and h.dtype in DTYPES and _may_be_equal(a.shape, b.shape)):
        return None
    if graph.constant(add.inputs[0]) is not None or graph.constant(add.inputs[1]) is not None:
        return None
    norms = [n for n in consumers.get(add.outputs[0], []) if _fusable_norm(graph, n, add.outputs[0])]
    return norms[0] if norms else None


def run(graph: Graph, ctx: PassContext) -> int:
    if ctx.device not in DEVICES:
        return 0
    changes = 0
    for add in [n for n in graph.nodes if n.op == "Add" and not n.domain]:
        norm = _match(graph, add, graph.consumers())
        if norm is None:
            continue
        fused = _fused(graph, add, norm)
        if not ctx.has_op(fused.op):
            continue
        remove(graph, [add, norm])
        graph.nodes.append(fused)
        graph.nodes = graph.toposort()
        changes += 1
    return changes
