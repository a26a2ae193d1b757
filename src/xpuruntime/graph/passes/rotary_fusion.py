"""Rotary embedding fusion: Hugging Face's rotate-half rotary embedding as both exporters write it,

    x_embed = x * Unsqueeze(cos, 1) + Concat(-Slice(x, D/2:), Slice(x, :D/2)) * Unsqueeze(sin, 1)

for the q and the k one attention reads (k directly, or through GQA's Unsqueeze / Expand / Reshape), becomes one
call of the `rotary_embedding` op on both: one kernel where the graph had three a tensor (the negation, the
concatenation, the products and sum). The op's packed [q_embed | k_embed] result is split back into q's and k's
shapes by Split and Reshape nodes whose sizes come from the inputs' shapes (planning folds them; on the GPU they
are views).

GPU graphs only, and full rotary (cos's last dim is the head dim): the op rounds each product and the sum to q's
dtype where q and cos share a half dtype, as the graph's nodes do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..ir import Graph, Node, Value
from .util import int_list, only_consumer, remove

if TYPE_CHECKING:
    from . import PassContext

DEVICES = ("cuda",)
DTYPES = ("float16", "bfloat16", "float32")
K_CHAIN = ("Unsqueeze", "Expand", "Reshape")  # GQA's repeat of k's heads between the rotary embedding and attention


def _slice(graph: Graph, node: Node | None, x: str, start: int, end: int) -> bool:
    """`node` is Slice(x) over the last axis alone, from `start` to at least `end` (to exactly `end` when the
    slice starts at 0), step 1."""
    if node is None or node.op != "Slice" or node.domain or node.inputs[:1] != [x] or len(node.inputs) < 4:
        return False
    rank = len(graph.value(x).shape or ())
    starts, ends, axes = (int_list(graph, name) for name in node.inputs[1:4])
    steps = int_list(graph, node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] else [1]
    if axes not in ([-1], [rank - 1]) or steps != [1] or starts != [start] or ends is None:
        return False
    return ends[0] == end if start == 0 else ends[0] >= end


def _unsqueezed(graph: Graph, name: str, producers: dict) -> str | None:
    """t, when `name` is Unsqueeze(t, axes=[1]) of a 3-d t."""
    node = producers.get(name)
    if node is None or node.op != "Unsqueeze" or node.domain:
        return None
    axes = node.attrs.get("axes") if len(node.inputs) < 2 else int_list(graph, node.inputs[1])
    shape = graph.value(node.inputs[0]).shape
    return node.inputs[0] if list(axes or []) == [1] and shape is not None and len(shape) == 3 else None


def _rotated(graph: Graph, cat: Node, x: str, producers: dict, consumers: dict) -> list[Node] | None:
    """The nodes of Concat(-x2, x1) for the halves x1, x2 of x's last dim, or None."""
    shape = graph.value(x).shape
    width = shape[-1] if shape else None
    if not isinstance(width, int) or width % 2 or cat.attrs.get("axis") not in (-1, len(shape) - 1):
        return None
    if len(cat.inputs) != 2:
        return None
    neg, first = producers.get(cat.inputs[0]), producers.get(cat.inputs[1])
    second = producers.get(neg.inputs[0]) if neg is not None and neg.op == "Neg" and not neg.domain else None
    half = width // 2
    if not (_slice(graph, first, x, 0, half) and _slice(graph, second, x, half, width)):
        return None
    nodes = [neg, first, second]
    if any(only_consumer(graph, consumers, n.outputs[0]) is None for n in nodes):
        return None
    return nodes


def _match(graph: Graph, add: Node, producers: dict, consumers: dict) -> tuple[str, str, str, list[Node]] | None:
    """(x, cos, sin, the pattern's nodes) when `add` is x's rotary embedding, else None."""
    if add.op != "Add" or add.domain or len(add.inputs) != 2:
        return None
    muls = [producers.get(name) for name in add.inputs]
    if any(m is None or m.op != "Mul" or m.domain or len(m.inputs) != 2 for m in muls):
        return None
    for plain, rotated in (muls, muls[::-1]):
        cat = next((producers.get(i) for i in rotated.inputs if getattr(producers.get(i), "op", "") == "Concat"), None)
        if cat is None:
            continue
        sin = _unsqueezed(graph, next((i for i in rotated.inputs if i != cat.outputs[0]), ""), producers)
        for x, cos4 in (plain.inputs, plain.inputs[::-1]):
            cos = _unsqueezed(graph, cos4, producers)
            if cos is None or sin is None or graph.value(x).dtype not in DTYPES:
                continue
            halves = _rotated(graph, cat, x, producers, consumers)
            shape, cos_shape = graph.value(x).shape, graph.value(cos).shape
            if halves is None or len(shape) != 4 or cos_shape[-1] != shape[-1]:
                continue
            nodes = [add, *muls, cat, *halves]
            if any(only_consumer(graph, consumers, n.outputs[0]) is None for n in [*muls, cat]):
                continue
            return x, cos, sin, nodes
    return None


def _key_source(name: str, producers: dict) -> str:
    """What attention's k is made from: back through GQA's Unsqueeze / Expand / Reshape."""
    node = producers.get(name)
    while node is not None and node.op in K_CHAIN and not node.domain:
        name = node.inputs[0]
        node = producers.get(name)
    return name


def _split_back(graph: Graph, packed: str, sources: list[tuple[str, str]], dtype: str) -> list[Node]:
    """Nodes making each (input, output) pair's output from its part of the flat `packed` result."""
    zero = graph.add_constant("rotary_axis", np.array([0], np.int64))
    sizes, parts, nodes = [], [], []
    for x, _ in sources:
        size, size1, part = (graph.fresh_name(f"rotary_{what}") for what in ("size", "size1", "part"))
        graph.set_value(Value(size, "int64", ()))
        graph.set_value(Value(size1, "int64", (1,)))
        graph.set_value(Value(part, dtype, (None,)))
        nodes += [Node("Size", [x], [size], {}, graph.fresh_name("RotarySize")),
                  Node("Unsqueeze", [size, zero], [size1], {}, graph.fresh_name("RotarySize"))]  # fmt: skip
        sizes.append(size1)
        parts.append(part)
    split_sizes = graph.fresh_name("rotary_sizes")
    graph.set_value(Value(split_sizes, "int64", (len(sources),)))
    nodes.append(Node("Concat", sizes, [split_sizes], {"axis": 0}, graph.fresh_name("RotarySizes")))
    nodes.append(Node("Split", [packed, split_sizes], parts, {"axis": 0}, graph.fresh_name("RotarySplit")))
    for (x, out), part in zip(sources, parts):
        shape = graph.fresh_name("rotary_shape")
        graph.set_value(Value(shape, "int64", (len(graph.value(x).shape or ()),)))
        nodes += [Node("Shape", [x], [shape], {}, graph.fresh_name("RotaryShape")),
                  Node("Reshape", [part, shape], [out], {}, graph.fresh_name("RotaryReshape"))]  # fmt: skip
    return nodes


def run(graph: Graph, ctx: PassContext) -> int:
    if ctx.device not in DEVICES or not ctx.has_op("rotary_embedding") or graph.opset < 13:
        return 0
    changes = 0
    for attention in [n for n in graph.nodes if n.op == "attention" and n.domain == "xrt"]:
        producers, consumers = graph.producers(), graph.consumers()
        q_add, k_add = producers.get(attention.inputs[0]), producers.get(_key_source(attention.inputs[1], producers))
        if q_add is None or k_add is None or q_add is k_add:
            continue
        q, k = _match(graph, q_add, producers, consumers), _match(graph, k_add, producers, consumers)
        if q is None or k is None or q[1:3] != k[1:3] or graph.value(q[0]).dtype != graph.value(k[0]).dtype:
            continue
        dtype = graph.value(q[0]).dtype
        packed = graph.fresh_name("rotary_packed")
        graph.set_value(Value(packed, dtype, (None,)))
        fused = Node("rotary_embedding", [q[0], k[0], q[1], q[2]], [packed], {"unsqueeze_dim": 1, "interleaved": False},
                     graph.fresh_name("Rotary"), "xrt")  # fmt: skip
        remove(graph, [*q[3], *k[3]])
        graph.nodes += [fused, *_split_back(graph, packed, [(q[0], q_add.outputs[0]), (k[0], k_add.outputs[0])], dtype)]
        graph.nodes = graph.toposort()
        changes += 1
    return changes
