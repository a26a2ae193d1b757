"""GELU pattern fusion: the forms exporters emit become one Gelu node (which elementwise fusion turns into a single
instruction, and linear fusion on the GPU into a GEMM epilogue for the tanh form).

    erf form   x * 0.5 * (1 + erf(x / sqrt(2)))                                        Gelu(x)
    tanh form  x * 0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))  (GPT-2's)      Gelu(x, approximate="tanh")

The product of x, 0.5 and (1 + erf/tanh) is recognised in every order exporters write it: (x * 0.5) * (1 + t),
x * (0.5 * (1 + t)), (x * (1 + t)) * 0.5, ...
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..ir import Graph, Node
from .util import is_close, matches, only_consumer, other_input, remove, scalar

if TYPE_CHECKING:
    from . import PassContext

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _times_constant(graph: Graph, node: Node | None, c: float) -> str | None:
    """x, when `node` is x * c (either order) or, for c = 1/sqrt(2), x / sqrt(2)."""
    if node is None or node.domain or len(node.inputs) != 2:
        return None
    x, y = node.inputs
    if node.op == "Div" and is_close(c, 1.0 / math.sqrt(2.0)) and is_close(scalar(graph, y), math.sqrt(2.0)):
        return x
    if node.op == "Mul":
        for a, b in ((x, y), (y, x)):
            if is_close(scalar(graph, b), c):
                return a
    return None


def _erf_argument(graph: Graph, producers: dict, erf: Node) -> tuple[str, list[Node]] | None:
    scaled = producers.get(erf.inputs[0])
    x = _times_constant(graph, scaled, 1.0 / math.sqrt(2.0))
    return None if x is None else (x, [scaled])


def _cube(graph: Graph, producers: dict, name: str, x: str) -> Node | None:
    node = producers.get(name)
    if node is not None and node.op == "Pow" and node.inputs[0] == x and scalar(graph, node.inputs[1]) == 3.0:
        return node
    return None


def _tanh_argument(graph: Graph, producers: dict, tanh: Node) -> tuple[str, list[Node]] | None:
    """x and the nodes of sqrt(2/pi) * (x + 0.044715 * x^3)."""
    outer = producers.get(tanh.inputs[0])
    inner_name = _times_constant(graph, outer, SQRT_2_OVER_PI)
    inner = producers.get(inner_name or "")
    if inner is None or inner.op != "Add" or inner.domain:
        return None
    for x, cubic in (inner.inputs, inner.inputs[::-1]):
        scaled = producers.get(cubic)
        cube = _cube(graph, producers, _times_constant(graph, scaled, 0.044715) or "", x)
        if cube is not None:
            return x, [outer, inner, scaled, cube]
    return None


def _half_x_product(graph: Graph, add: Node, x: str, producers: dict, consumers: dict) -> tuple | None:
    """Follow the Muls after `add` (1 + erf or tanh): (last Mul, nodes) when they multiply it by x and 0.5."""
    nodes: list[Node] = []
    current, has_x, has_half = add, False, False
    while not (has_x and has_half):
        mul = only_consumer(graph, consumers, current.outputs[0])
        if mul is None or mul.op != "Mul" or mul.domain:
            return None
        other = other_input(mul, current.outputs[0]) or ""
        half = producers.get(other)
        if other == x and not has_x:
            has_x = True
        elif is_close(scalar(graph, other), 0.5) and not has_half:
            has_half = True
        elif not (has_x or has_half) and _times_constant(graph, half, 0.5) == x:
            if len(consumers.get(other, [])) != 1:
                return None
            has_x = has_half = True
            nodes.append(half)
        else:
            return None
        nodes.append(mul)
        current = mul
    return current, nodes


def _match(graph: Graph, node: Node, producers: dict, consumers: dict) -> tuple[str, Node, list[Node]] | None:
    argument = (_erf_argument if node.op == "Erf" else _tanh_argument)(graph, producers, node)
    add = only_consumer(graph, consumers, node.outputs[0])
    if argument is None or add is None or add.op != "Add" or add.domain:
        return None
    if not is_close(scalar(graph, other_input(add, node.outputs[0]) or ""), 1.0):
        return None
    x, head = argument
    if any(len(consumers.get(n.outputs[0], [])) != 1 for n in head):
        return None
    tail = _half_x_product(graph, add, x, producers, consumers)
    if tail is None:
        return None
    last, product = tail
    return x, last, [*head, node, add, *product]


def run(graph: Graph, ctx: PassContext) -> int:
    changes = 0
    for node, (x, last, matched) in matches(graph, ("Erf", "Tanh"), _match):
        attrs = {"approximate": "tanh"} if node.op == "Tanh" else {}
        gelu = Node("Gelu", [x], [last.outputs[0]], attrs, graph.fresh_name("Gelu"))
        remove(graph, matched)
        graph.nodes.append(gelu)
        graph.nodes = graph.toposort()
        changes += 1
    return changes
