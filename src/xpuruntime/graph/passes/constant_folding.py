"""Constant folding: nodes whose inputs are all constants become constants, and so do Shape nodes
(and Gathers from them) over dims that shape inference knows, and CastLike(constant, x) for x of a known dtype
(the dynamo exporter's zero bias of a bias-free Conv reads the input's dtype that way). Large results are not
folded."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from ..ir import Graph, Node

if TYPE_CHECKING:
    from . import PassContext

MAX_FOLDED_ELEMENTS = 1 << 20


def _too_large(graph: Graph, node: Node) -> bool:
    """Whether shape inference says an output has more elements than folding keeps (checked before computing)."""
    for name in node.outputs:
        shape = graph.value(name).shape if name else None
        if shape is not None and all(isinstance(d, int) for d in shape) and math.prod(shape) > MAX_FOLDED_ELEMENTS:
            return True
    return False


def _evaluate(graph: Graph, node: Node, ctx: PassContext) -> list[np.ndarray] | None:
    if _too_large(graph, node):
        return None
    args = [graph.constant(n) if n else None for n in node.inputs]
    # None: too large to fold (the semantics estimate the outputs before computing), or left to run time
    arrays = ctx.semantics.evaluate(node, args, graph.opset, MAX_FOLDED_ELEMENTS)
    if arrays is None:
        return None
    return arrays if all(a.size <= MAX_FOLDED_ELEMENTS for a in arrays) else None


def _known_shape(graph: Graph, node: Node) -> np.ndarray | None:
    """Shape(x) when x's dims (within start:end) are all fixed ints."""
    shape = graph.value(node.inputs[0]).shape
    if shape is None:
        return None
    dims = shape[node.attrs.get("start", 0) : node.attrs.get("end")]
    if not all(isinstance(d, int) for d in dims):
        return None
    return np.array(dims, np.int64)


def _gather_of_shape(graph: Graph, node: Node, producers: dict) -> np.ndarray | None:
    """Gather(Shape(x), const indices) when the gathered dims are fixed ints."""
    source = producers.get(node.inputs[0])
    indices = graph.constant(node.inputs[1]) if len(node.inputs) > 1 else None
    if source is None or source.op != "Shape" or indices is None or indices.dtype.kind not in "iu":
        return None
    shape = graph.value(source.inputs[0]).shape
    if shape is None:
        return None
    dims = list(shape[source.attrs.get("start", 0) : source.attrs.get("end")])
    try:
        picked = np.asarray(dims, dtype=object)[indices]
    except IndexError:
        return None
    picked = np.asarray(picked, dtype=object)
    if not all(isinstance(d, int) for d in picked.reshape(-1)):
        return None
    return picked.astype(np.int64)


def run(graph: Graph, ctx: PassContext) -> int:
    changes = 0
    producers = graph.producers()
    kept = []
    for node in graph.nodes:
        if node.domain:
            kept.append(node)
            continue
        if all(not n or graph.constant(n) is not None for n in node.inputs):
            results = _evaluate(graph, node, ctx)
        elif node.op == "Shape":
            shape = _known_shape(graph, node)
            results = None if shape is None else [shape]
        elif node.op == "Gather":
            picked = _gather_of_shape(graph, node, producers)
            results = None if picked is None else [picked]
        elif node.op == "CastLike" and graph.constant(node.inputs[0]) is not None:
            dtype = graph.value(node.inputs[1]).dtype
            results = None if dtype is None else [graph.constant(node.inputs[0]).astype(dtype)]
        else:
            results = None
        if results is None or len(results) != len([o for o in node.outputs if o]):
            kept.append(node)
            continue
        for name, array in zip(node.outputs, results):
            graph.initializers[name] = array
            graph.values.pop(name, None)
        changes += 1
    graph.nodes = kept
    return changes
