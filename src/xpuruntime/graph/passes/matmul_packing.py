"""MatMul packing: MatMuls that read one activation with constant 2-D weights (attention's Q, K and V
projections) become one MatMul on the weights concatenated along N, then a Split (onnxruntime packs QKV
the same way): one larger GEMM and, when each MatMul feeds an Add of a constant bias, one bias Add for all,
instead of a GEMM and a bias kernel per projection.

CPU graphs only: on the GPU the linear fusion has already made these MatMuls `linear` calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..ir import Graph, Node, Value
from .util import only_consumer, other_input, remove

if TYPE_CHECKING:
    from . import PassContext

FLOATS = ("float16", "float32", "float64")


def _weight(graph: Graph, node: Node) -> np.ndarray | None:
    """The MatMul's constant 2-D float weight (same dtype as its activation), or None."""
    if node.op != "MatMul" or node.domain or len(node.inputs) != 2:
        return None
    w = graph.constant(node.inputs[1])
    if w is None or w.ndim != 2 or w.dtype.name not in FLOATS or graph.value(node.inputs[0]).dtype != w.dtype.name:
        return None
    return w


def _groups(graph: Graph) -> list[list[Node]]:
    """MatMuls with a constant weight, grouped by activation and weight (K, dtype); groups of two or more."""
    groups: dict[tuple, list[Node]] = {}
    for node in graph.nodes:
        w = _weight(graph, node)
        if w is not None:
            groups.setdefault((node.inputs[0], w.shape[0], w.dtype.name), []).append(node)
    return [g for g in groups.values() if len(g) > 1]


def _bias_adds(graph: Graph, group: list[Node], consumers: dict) -> list[tuple[Node, np.ndarray]] | None:
    """Per MatMul, its only reader when that is an Add of a constant bias of the MatMul's width (any
    leading 1s), else None for the whole group (biases are packed for all or none)."""
    found = []
    x = graph.value(group[0].inputs[0]).shape
    rank = None if x is None else max(len(x), 1)  # the MatMuls' output rank
    for mm in group:
        w = graph.constant(mm.inputs[1])
        add = only_consumer(graph, consumers, mm.outputs[0])
        if add is None or add.op != "Add" or add.domain:
            return None
        bias = graph.constant(other_input(add, mm.outputs[0]) or "")
        if bias is None or bias.dtype != w.dtype or bias.size != w.shape[1] or bias.shape[-1:] != w.shape[1:]:
            return None
        if bias.ndim > 1 and (rank is None or bias.ndim > rank):  # a bias that widens the Add's output
            return None
        found.append((add, bias.reshape(-1)))
    return found


def _typed(graph: Graph, like: str, width: int, hint: str) -> str:
    """A fresh value name typed as `like` with its last dim replaced by `width`."""
    name = graph.fresh_name(hint)
    v = graph.value(like)
    shape = None if v.shape is None else (*v.shape[:-1], width)
    graph.set_value(Value(name, v.dtype, shape))
    return name


def _pack(graph: Graph, group: list[Node], adds: list[tuple[Node, np.ndarray]] | None) -> None:
    """Replace the group (and its bias Adds) by MatMul [-> Add] -> Split along the last axis."""
    x = group[0].inputs[0]
    weights = [graph.constant(mm.inputs[1]) for mm in group]
    sizes = [w.shape[1] for w in weights]
    packed = _typed(graph, group[0].outputs[0], sum(sizes), "packed_mm")
    nodes = [Node("MatMul", [x, graph.add_constant("packed_w", np.concatenate(weights, axis=1))], [packed],
                  name=graph.fresh_name("PackedMatMul"))]  # fmt: skip
    outputs = [mm.outputs[0] for mm in group]
    if adds is not None:
        biased = _typed(graph, group[0].outputs[0], sum(sizes), "packed_add")
        bias = graph.add_constant("packed_b", np.concatenate([b for _, b in adds]))
        nodes.append(Node("Add", [packed, bias], [biased], name=graph.fresh_name("PackedAdd")))
        outputs, packed = [add.outputs[0] for add, _ in adds], biased
    split_sizes = np.array(sizes, np.int64)
    if graph.opset >= 13:
        split = Node("Split", [packed, graph.add_constant("packed_split", split_sizes)], outputs, {"axis": -1})
    else:
        split = Node("Split", [packed], outputs, {"axis": -1, "split": split_sizes.tolist()})
    split.name = graph.fresh_name("PackedSplit")
    remove(graph, [*group, *(add for add, _ in adds or ())])
    graph.nodes += [*nodes, split]


def run(graph: Graph, ctx: PassContext) -> int:
    if ctx.device != "cpu":
        return 0
    changes = 0
    for group in _groups(graph):
        _pack(graph, group, _bias_adds(graph, group, graph.consumers()))
        changes += 1
    if changes:
        graph.nodes = graph.toposort()
    return changes
