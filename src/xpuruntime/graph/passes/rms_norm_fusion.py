"""RMSNorm pattern fusion: the decomposition exporters emit for Llama-style RMSNorm,

    r = 1 / Sqrt(ReduceMean(x^2 or x*x, last axis) + eps)     (Reciprocal(Sqrt) or Div(1, Sqrt))
    y = x * r  [-> Cast back to the input's dtype]  [* weight]

with x possibly a Cast of the model's fp16/bf16 activation up to float32 (HF computes the norm in float32),
becomes one call of the `rms_norm` op on the original activation (it accumulates in float32 itself).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..ir import Graph, Node, Value
from .util import int_list, matches, only_consumer, other_input, remove, scalar

if TYPE_CHECKING:
    from . import PassContext

HALF = ("float16", "bfloat16")


def _mean_of_square(graph: Graph, mean: Node, producers: dict) -> tuple[str, Node] | None:
    """(x, square node) when `mean` is ReduceMean(x^2 or x*x) over the last axis, keeping it."""
    if mean.domain or not mean.attrs.get("keepdims", 1):
        return None
    axes = mean.attrs.get("axes") if len(mean.inputs) < 2 else int_list(graph, mean.inputs[1])
    rank = graph.value(mean.inputs[0]).shape
    if axes is None or len(axes) != 1 or not (axes[0] == -1 or (rank is not None and axes[0] == len(rank) - 1)):
        return None
    square = producers.get(mean.inputs[0])
    if square is None or square.domain:
        return None
    if square.op == "Pow" and scalar(graph, square.inputs[1]) == 2.0:
        return square.inputs[0], square
    if square.op == "Mul" and square.inputs[0] == square.inputs[1]:
        return square.inputs[0], square
    return None


def _inverse_root(graph: Graph, mean: Node, consumers: dict) -> tuple[float, Node, list[Node]] | None:
    """(eps, the node computing 1/sqrt(mean + eps), the nodes) after the mean."""
    add = only_consumer(graph, consumers, mean.outputs[0])
    eps = scalar(graph, other_input(add, mean.outputs[0]) or "") if add is not None and add.op == "Add" else None
    sqrt = only_consumer(graph, consumers, add.outputs[0]) if eps is not None else None
    if sqrt is None or sqrt.op != "Sqrt":
        return None
    inverse = only_consumer(graph, consumers, sqrt.outputs[0])
    if inverse is None or not (
        inverse.op == "Reciprocal" or (inverse.op == "Div" and inverse.inputs[1] == sqrt.outputs[0]
                                       and scalar(graph, inverse.inputs[0]) == 1.0)
    ):  # fmt: skip
        return None
    return float(eps), inverse, [add, sqrt, inverse]


def _match(graph: Graph, mean: Node, producers: dict, consumers: dict) -> tuple | None:
    found = _mean_of_square(graph, mean, producers)
    if found is None:
        return None
    x, square = found
    root = _inverse_root(graph, mean, consumers)
    if root is None or len(consumers.get(square.outputs[0], [])) != 1:
        return None
    eps, inverse, nodes = root
    scale = only_consumer(graph, consumers, inverse.outputs[0])
    if scale is None or scale.op != "Mul" or other_input(scale, inverse.outputs[0]) != x:
        return None
    matched, last, source = [square, mean, *nodes, scale], scale, x
    upcast = producers.get(x)
    if upcast is not None and upcast.op == "Cast" and graph.value(upcast.inputs[0]).dtype in HALF:
        if {id(u) for u in consumers.get(x, [])} != {id(square), id(scale)}:
            return None
        source = upcast.inputs[0]  # HF: x.to(float32) ... (x * r).to(input dtype)
        down = only_consumer(graph, consumers, scale.outputs[0])
        if down is None or down.op != "Cast" or down.attrs.get("to") != graph.value(source).dtype:
            return None
        matched, last = [upcast, *matched, down], down
    return source, eps, last, matched


def _weight(graph: Graph, last: Node, width: int, dtype: str, consumers: dict) -> tuple[str, Node] | None:
    """The constant 1-D weight multiplied in after the norm, and that Mul."""
    mul = only_consumer(graph, consumers, last.outputs[0])
    other = other_input(mul, last.outputs[0]) if mul is not None and mul.op == "Mul" and not mul.domain else None
    weight = graph.constant(other or "")
    if weight is None or weight.dtype.name != dtype or weight.size != width or weight.ndim != 1:
        return None
    return other, mul


def run(graph: Graph, ctx: PassContext) -> int:
    if not ctx.has_op("rms_norm"):
        return 0
    changes = 0
    for _, (x, eps, last, matched) in matches(graph, ("ReduceMean",), _match):
        consumers = graph.consumers()
        shape, dtype = graph.value(x).shape, graph.value(x).dtype
        if shape is None or not shape or not isinstance(shape[-1], int) or dtype not in ("float32", "float64", *HALF):
            continue
        weighted = _weight(graph, last, shape[-1], dtype, consumers)
        if weighted is not None:
            weight, last = weighted
            matched.append(last)
        else:
            weight = graph.add_constant("rms_weight", np.ones(shape[-1], dtype))
        out = last.outputs[0]
        graph.set_value(Value(out, dtype, graph.value(out).shape or shape))
        fused = Node("rms_norm", [x, weight], [out], {"normalized_shape": (shape[-1],), "eps": eps},
                     graph.fresh_name("RMSNorm"), "xrt")  # fmt: skip
        remove(graph, matched)
        graph.nodes.append(fused)
        graph.nodes = graph.toposort()
        changes += 1
    return changes
