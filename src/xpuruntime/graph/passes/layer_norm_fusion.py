"""Layer-norm pattern fusion: the decomposition exporters emit for opsets before 17,
    mean = ReduceMean(x, [-1]); d = x - mean; var = ReduceMean(d*d or d^2, [-1]);
    y = d / Sqrt(var + eps) [* scale] [+ bias]
becomes one LayerNormalization node (run by the `layer_norm` op)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..ir import Graph, Node
from .util import int_list, only_consumer, other_input, remove, scalar

if TYPE_CHECKING:
    from . import PassContext


def _last_axis_mean(graph: Graph, node: Node | None) -> bool:
    if node is None or node.op != "ReduceMean" or not node.attrs.get("keepdims", 1):
        return False
    axes = node.attrs.get("axes") if len(node.inputs) < 2 else int_list(graph, node.inputs[1])
    rank = graph.value(node.inputs[0]).shape
    return axes is not None and len(axes) == 1 and (axes[0] == -1 or (rank is not None and axes[0] == len(rank) - 1))


def _match(graph: Graph, mean: Node, producers: dict, consumers: dict) -> tuple | None:
    x = mean.inputs[0]
    subs = [u for u in consumers.get(mean.outputs[0], []) if u.op == "Sub" and u.inputs == [x, mean.outputs[0]]]
    if len(subs) != 1 or len(consumers.get(mean.outputs[0], [])) != 1:
        return None
    sub = subs[0]
    d = sub.outputs[0]
    users = consumers.get(d, [])
    square = next((u for u in users if (u.op == "Pow" and u.inputs[0] == d and scalar(graph, u.inputs[1]) == 2.0)
                   or (u.op == "Mul" and u.inputs == [d, d])), None)  # fmt: skip
    div = next((u for u in users if u.op == "Div" and u.inputs[0] == d), None)
    if square is None or div is None or len(users) != 2:
        return None
    var = only_consumer(graph, consumers, square.outputs[0])
    if not _last_axis_mean(graph, var):
        return None
    add = only_consumer(graph, consumers, var.outputs[0])
    eps = scalar(graph, other_input(add, var.outputs[0]) or "") if add is not None and add.op == "Add" else None
    sqrt = only_consumer(graph, consumers, add.outputs[0]) if eps is not None else None
    if sqrt is None or sqrt.op != "Sqrt" or only_consumer(graph, consumers, sqrt.outputs[0]) is not div:
        return None
    if div.inputs[1] != sqrt.outputs[0]:
        return None
    matched, last, scale, bias = [mean, sub, square, var, add, sqrt, div], div, None, None
    mul = only_consumer(graph, consumers, div.outputs[0])
    if mul is not None and mul.op == "Mul" and graph.constant(other_input(mul, div.outputs[0]) or "") is not None:
        scale, last = other_input(mul, div.outputs[0]), mul
        matched.append(mul)
        add_b = only_consumer(graph, consumers, mul.outputs[0])
        if (
            add_b is not None
            and add_b.op == "Add"
            and graph.constant(other_input(add_b, mul.outputs[0]) or "") is not None
        ):
            bias, last = other_input(add_b, mul.outputs[0]), add_b
            matched.append(add_b)
    return x, scale, bias, float(eps), last, matched


def run(graph: Graph, ctx: PassContext) -> int:
    changes = 0
    for mean in [n for n in graph.nodes if n.op == "ReduceMean" and not n.domain]:
        if mean not in graph.nodes or not _last_axis_mean(graph, mean):
            continue
        found = _match(graph, mean, graph.producers(), graph.consumers())
        if found is None:
            continue
        x, scale, bias, eps, last, matched = found
        width = graph.value(x).shape
        dtype = graph.value(x).dtype
        if scale is None:
            if width is None or not isinstance(width[-1], int) or dtype is None:
                continue
            scale = graph.add_constant("ln_scale", np.ones(width[-1], dtype))
        scale_array = graph.constant(scale)
        if (
            scale_array is None
            or scale_array.ndim != 1
            or (bias is not None and graph.constant(bias).shape != scale_array.shape)
        ):
            continue
        inputs = [x, scale] + ([bias] if bias is not None else [])
        fused = Node("LayerNormalization", inputs, [last.outputs[0]], {"axis": -1, "epsilon": eps},
                     graph.fresh_name("LayerNorm"))  # fmt: skip
        index = graph.nodes.index(last)
        remove(graph, matched)
        graph.nodes.insert(min(index, len(graph.nodes)), fused)
        graph.nodes = graph.toposort()
        changes += 1
    return changes
