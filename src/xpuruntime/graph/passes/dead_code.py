"""Dead-node removal: drop nodes none of whose outputs reach a graph output, and unused initializers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..ir import Graph

if TYPE_CHECKING:
    from . import PassContext


def run(graph: Graph, ctx: PassContext) -> int:
    needed = set(graph.output_names())
    kept = []
    for node in reversed(graph.nodes):
        if any(o in needed for o in node.outputs):
            kept.append(node)
            needed.update(n for n in node.inputs if n)
    removed = len(graph.nodes) - len(kept)
    graph.nodes = kept[::-1]
    for name in [n for n in graph.initializers if n not in needed]:
        del graph.initializers[name]
    return removed
