"""MatMul packing: MatMuls that read one activation with constant 2-D weights (attention's Q, K and V
projections, Llama's gate and up) become one MatMul on the weights concatenated along N, then a Split
(onnxruntime packs QKV the same way): one larger GEMM and, when each MatMul feeds an Add of a constant bias, one
bias Add for all, instead of a GEMM and a bias kernel per projection.

On the GPU the linear fusion has already made the biased ones `linear` calls: those reading one activation with
the same activation function and biases for all or none become one `linear` on the weights concatenated along
N (their rows), then a Split. Its outputs are views of the packed result; the attention and rotary kernels
read such strided q, k and v in place. BERT-base fp32 at B1 S128 on an H200: three (128, 768) x (768, 768)
GEMMs take 3 x 12.1 us, one (768, 2304) 19.5 us (benchmarks/probes/fp32_gemm_gpu.py); at B32 S128 3 x 132 us
against 380 us.
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
    remove(graph, [*group, *(add for add, _ in adds or ())])
    graph.nodes += [*nodes, _split(graph, packed, sizes, outputs)]


def _split(graph: Graph, packed: str, sizes: list[int], outputs: list[str]) -> Node:
    """Split of the packed result's last axis back into the outputs (sizes as an input from opset 13)."""
    split_sizes = np.array(sizes, np.int64)
    if graph.opset >= 13:
        split = Node("Split", [packed, graph.add_constant("packed_split", split_sizes)], outputs, {"axis": -1})
    else:
        split = Node("Split", [packed], outputs, {"axis": -1, "split": split_sizes.tolist()})
    split.name = graph.fresh_name("PackedSplit")
    return split


def _linear_weight(graph: Graph, node: Node) -> np.ndarray | None:
    """A `linear` node's constant (N, K) weight, or None."""
    if node.op != "linear" or node.domain != "xrt" or len(node.inputs) < 2:
        return None
    w = graph.constant(node.inputs[1])
    return w if w is not None and w.ndim == 2 and w.dtype.name in FLOATS else None


def _linear_groups(graph: Graph) -> list[list[Node]]:
    """`linear` nodes with a constant weight, grouped by activation, K, dtype, activation function and whether
    they have a (constant) bias; groups of two or more."""
    groups: dict[tuple, list[Node]] = {}
    for node in graph.nodes:
        w = _linear_weight(graph, node)
        bias = node.inputs[2] if len(node.inputs) > 2 else ""
        if w is None or (bias and graph.constant(bias) is None):
            continue
        key = (node.inputs[0], w.shape[1], w.dtype.name, node.attrs.get("activation"), bool(bias))
        groups.setdefault(key, []).append(node)
    return [g for g in groups.values() if len(g) > 1]


def _pack_linears(graph: Graph, group: list[Node]) -> None:
    """Replace the group by one `linear` on the stacked weights (and biases) -> Split along the last axis."""
    weights = [graph.constant(node.inputs[1]) for node in group]
    sizes = [w.shape[0] for w in weights]
    packed = _typed(graph, group[0].outputs[0], sum(sizes), "packed_linear")
    inputs = [group[0].inputs[0], graph.add_constant("packed_w", np.concatenate(weights, axis=0))]
    biased = len(group[0].inputs) > 2 and group[0].inputs[2]
    inputs.append(graph.add_constant("packed_b", np.concatenate([graph.constant(n.inputs[2]) for n in group]))
                  if biased else "")  # fmt: skip
    linear = Node("linear", inputs, [packed], dict(group[0].attrs), graph.fresh_name("PackedLinear"), "xrt")
    remove(graph, group)
    graph.nodes += [linear, _split(graph, packed, sizes, [n.outputs[0] for n in group])]


def run(graph: Graph, ctx: PassContext) -> int:
    changes = 0
    for group in _groups(graph):
        _pack(graph, group, _bias_adds(graph, group, graph.consumers()))
        changes += 1
    if ctx.device != "cpu":
        for group in _linear_groups(graph):
            _pack_linears(graph, group)
            changes += 1
    if changes:
        graph.nodes = graph.toposort()
    return changes
