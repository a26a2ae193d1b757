"""Shape and dtype inference: fill in the type of every intermediate value (symbolic dims kept).

The types come from the ops' semantics (for ONNX graphs, ONNX's own inference on the graph as it is now,
which skips nodes of the 'xrt' domain: the fusion passes record their outputs' types themselves). Best
effort: the executor does not depend on it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..ir import Graph

if TYPE_CHECKING:
    from . import PassContext


def run(graph: Graph, ctx: PassContext) -> int:
    known = {v.name for v in (*graph.inputs, *graph.outputs)} | set(graph.initializers)
    count = 0
    for value in ctx.semantics.infer_types(graph):
        if value.name in known and value.name not in graph.output_names():
            continue
        if value.dtype is None and value.shape is None:
            continue
        old = graph.values.get(value.name)
        if old is None or (old.dtype, old.shape) != (value.dtype, value.shape):
            graph.values[value.name] = value
            count += 1
    return count
