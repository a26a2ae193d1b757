"""Attention pattern fusion: MatMul(q, K^T) [/ c or * c] [+ mask] -> Softmax(last axis) -> MatMul(., v)
becomes one call of the `attention` op, with K recovered from the transpose that produced K^T."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..ir import Graph, Node
from .util import only_consumer, remove, scalar

if TYPE_CHECKING:
    from . import PassContext


def _key(graph: Graph, kt: str, producers: dict) -> tuple[str, Node | None] | None:
    """(k, new Transpose node or None) such that kt == swap of k's last two axes."""
    node = producers.get(kt)
    if node is None or node.op != "Transpose" or not node.attrs.get("perm"):
        return None
    perm = list(node.attrs["perm"])
    if len(perm) < 2:
        return None
    k_perm = [*perm[:-2], perm[-1], perm[-2]]
    if k_perm == list(range(len(perm))):
        return node.inputs[0], None
    name = graph.fresh_name("attn_k")
    return name, Node("Transpose", [node.inputs[0]], [name], {"perm": k_perm}, graph.fresh_name("AttnKeyTranspose"))


def _match(graph: Graph, scores: Node, producers: dict, consumers: dict) -> tuple | None:
    q, kt = scores.inputs
    dtype = graph.value(q).dtype
    current, chain, scale, mask = scores, [scores], 1.0, None
    nxt = only_consumer(graph, consumers, current.outputs[0])
    if nxt is not None and nxt.op in ("Div", "Mul") and nxt.inputs[0] == current.outputs[0]:
        c = scalar(graph, nxt.inputs[1])
        if c is None or c == 0:
            return None
        scale = 1.0 / c if nxt.op == "Div" else c
        current, chain = nxt, [*chain, nxt]
        nxt = only_consumer(graph, consumers, current.outputs[0])
    if nxt is not None and nxt.op == "Add" and current.outputs[0] in nxt.inputs:
        mask = nxt.inputs[1] if nxt.inputs[0] == current.outputs[0] else nxt.inputs[0]
        if graph.value(mask).dtype != dtype:
            return None
        current, chain = nxt, [*chain, nxt]
        nxt = only_consumer(graph, consumers, current.outputs[0])
    if nxt is None or nxt.op != "Softmax":
        return None
    rank = graph.value(nxt.inputs[0]).shape
    axis = nxt.attrs.get("axis", -1 if graph.opset >= 13 else 1)
    if not (axis == -1 or (rank is not None and axis == len(rank) - 1)):
        return None
    softmax, chain = nxt, [*chain, nxt]
    out = only_consumer(graph, consumers, softmax.outputs[0])
    if out is None or out.op != "MatMul" or out.inputs[0] != softmax.outputs[0]:
        return None
    return q, kt, out.inputs[1], mask, scale, out, [*chain, out]


def run(graph: Graph, ctx: PassContext) -> int:
    if not ctx.has_op("attention"):
        return 0
    changes = 0
    for node in [n for n in graph.nodes if n.op == "MatMul" and not n.domain]:
        if node not in graph.nodes:
            continue
        producers, consumers = graph.producers(), graph.consumers()
        found = _match(graph, node, producers, consumers)
        if found is None:
            continue
        q, kt, v, mask, scale, last, matched = found
        dtype = graph.value(q).dtype
        if dtype not in ("float16", "float32", "float64") or graph.value(v).dtype != dtype:
            continue
        key = _key(graph, kt, producers)
        if key is None:
            continue
        k, transpose = key
        fused = Node("attention", [q, k, v, mask or ""], [last.outputs[0]], {"is_causal": False, "scale": float(scale)},
                     graph.fresh_name("Attention"), "xrt")  # fmt: skip
        remove(graph, matched)
        graph.nodes += ([transpose] if transpose is not None else []) + [fused]
        graph.nodes = graph.toposort()
        changes += 1
    return changes
