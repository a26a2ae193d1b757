"""GELU pattern fusion: the erf form exporters emit, x * 0.5 * (1 + erf(x / sqrt(2))) in its usual
orderings, becomes one Gelu node (which elementwise fusion turns into a single 'gelu' instruction)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..ir import Graph, Node
from .util import is_close, only_consumer, other_input, remove, scalar

if TYPE_CHECKING:
    from . import PassContext


def _erf_argument(graph: Graph, producers: dict, erf: Node) -> str | None:
    """x, when erf's input is x / sqrt(2) or x * (1 / sqrt(2))."""
    scaled = producers.get(erf.inputs[0])
    if scaled is None or len(scaled.inputs) != 2:
        return None
    x, c = scaled.inputs
    if scaled.op == "Div" and is_close(scalar(graph, c), math.sqrt(2.0)):
        return x
    if scaled.op == "Mul":
        for a, b in ((x, c), (c, x)):
            if is_close(scalar(graph, b), 1.0 / math.sqrt(2.0)):
                return a
    return None


def _match(graph: Graph, erf: Node, producers: dict, consumers: dict) -> tuple[str, Node, list[Node]] | None:
    x = _erf_argument(graph, producers, erf)
    add = only_consumer(graph, consumers, erf.outputs[0])
    if (
        x is None
        or add is None
        or add.op != "Add"
        or not is_close(scalar(graph, other_input(add, erf.outputs[0]) or ""), 1.0)
    ):
        return None
    mul = only_consumer(graph, consumers, add.outputs[0])
    if mul is None or mul.op != "Mul":
        return None
    partner = other_input(mul, add.outputs[0])
    half = producers.get(partner or "")
    if partner == x:  # (x * (1 + erf)) * 0.5
        last = only_consumer(graph, consumers, mul.outputs[0])
        if (
            last is None
            or last.op != "Mul"
            or not is_close(scalar(graph, other_input(last, mul.outputs[0]) or ""), 0.5)
        ):
            return None
        return x, last, [producers[erf.inputs[0]], erf, add, mul, last]
    if (
        half is not None
        and half.op == "Mul"
        and x in half.inputs
        and is_close(scalar(graph, other_input(half, x) or ""), 0.5)
    ):
        if len([u for u in graph.consumers().get(half.outputs[0], [])]) != 1:
            return None
        return x, mul, [producers[erf.inputs[0]], erf, add, half, mul]
    return None


def run(graph: Graph, ctx: PassContext) -> int:
    changes = 0
    for erf in [n for n in graph.nodes if n.op == "Erf" and not n.domain]:
        producers, consumers = graph.producers(), graph.consumers()
        found = _match(graph, erf, producers, consumers)
        if found is None:
            continue
        x, last, matched = found
        scaled = matched[0]
        if len(consumers.get(scaled.outputs[0], [])) != 1:
            continue
        gelu = Node("Gelu", [x], [last.outputs[0]], {}, graph.fresh_name("Gelu"))
        index = graph.nodes.index(last)
        remove(graph, matched)
        graph.nodes.insert(min(index, len(graph.nodes)), gelu)
        graph.nodes = graph.toposort()
        changes += 1
    return changes
