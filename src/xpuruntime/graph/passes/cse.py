"""Common-subexpression elimination: identical nodes on identical inputs (and identical small
constants) are computed once."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..ir import Graph
from .util import replace_uses

if TYPE_CHECKING:
    from . import PassContext

MAX_CONSTANT_BYTES = 4096


def _freeze(value: Any) -> Any:
    if isinstance(value, Graph):  # a subgraph: one only equals itself
        return ("graph", id(value))
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


def _merge_constants(graph: Graph) -> int:
    seen: dict[tuple, str] = {}
    changes = 0
    for name, array in list(graph.initializers.items()):
        if array.nbytes > MAX_CONSTANT_BYTES:
            continue
        key = (array.dtype.str, array.shape, array.tobytes())
        first = seen.setdefault(key, name)
        if first != name and replace_uses(graph, name, first):
            changes += 1
    return changes


def run(graph: Graph, ctx: PassContext) -> int:
    changes = _merge_constants(graph)
    seen: dict[tuple, list[str]] = {}
    kept = []
    for node in graph.nodes:
        key = (node.domain, node.op, tuple(node.inputs), tuple(sorted((k, _freeze(v)) for k, v in node.attrs.items())))
        first = seen.get(key)
        if (
            first is not None
            and len(first) == len(node.outputs)
            and all(n or not o for o, n in zip(node.outputs, first))
        ):
            outputs = graph.output_names()
            if not any(o in outputs for o in node.outputs):
                for old, new in zip(node.outputs, first):
                    if old:
                        replace_uses(graph, old, new)
                changes += 1
                continue
        seen.setdefault(key, node.outputs)
        kept.append(node)
    graph.nodes = kept
    return changes
