"""Small helpers shared by the passes: renaming uses, reading scalar constants, single-consumer checks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..ir import Graph, Node


def replace_uses(graph: Graph, old: str, new: str) -> bool:
    """Point every reader of `old` at `new`; False (and no change) if `old` is a graph output."""
    if old in graph.output_names():
        return False
    for node in graph.nodes:
        node.inputs = [new if name == old else name for name in node.inputs]
    return True


def scalar(graph: Graph, name: str) -> float | None:
    """The value of a constant with exactly one element, else None."""
    array = graph.constant(name)
    if array is None or array.size != 1 or array.dtype.kind not in "fiu":
        return None
    return float(array.reshape(-1)[0])


def only_consumer(graph: Graph, consumers: dict[str, list[Node]], name: str) -> Node | None:
    """The single node reading `name`, if exactly one does and `name` is not a graph output."""
    users = consumers.get(name, [])
    if len(users) != 1 or name in graph.output_names():
        return None
    return users[0]


def other_input(node: Node, name: str) -> str | None:
    """For a binary node with `name` as one input, the other input."""
    if len(node.inputs) != 2 or name not in node.inputs:
        return None
    a, b = node.inputs
    return b if a == name else a


def is_close(value: float | None, target: float, rel: float = 1e-3) -> bool:
    return value is not None and abs(value - target) <= rel * abs(target)


def remove(graph: Graph, doomed: list[Node]) -> None:
    ids = {id(n) for n in doomed}
    graph.nodes = [n for n in graph.nodes if id(n) not in ids]


def static_shape(graph: Graph, name: str) -> tuple | None:
    array = graph.constant(name)
    if array is not None:
        return array.shape
    return graph.value(name).shape


def int_list(graph: Graph, name: str) -> list[int] | None:
    array = graph.constant(name)
    if array is None or array.dtype.kind not in "iu":
        return None
    return [int(v) for v in np.asarray(array).reshape(-1)]


def matches(graph: Graph, ops: tuple[str, ...], match: Callable[..., Any]) -> Iterator[tuple[Node, Any]]:
    """Each default-domain node of `ops` still in the graph, with what `match(graph, node, producers, consumers)`
    found for it (skipped when None); producers and consumers are fresh for every node, as the caller rewrites
    the graph between matches."""
    for node in [n for n in graph.nodes if n.op in ops and not n.domain]:
        if node not in graph.nodes:
            continue
        found = match(graph, node, graph.producers(), graph.consumers())
        if found is not None:
            yield node, found
