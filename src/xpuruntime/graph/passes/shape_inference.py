"""Shape and dtype inference: fill in the type of every intermediate value (symbolic dims kept).

Uses ONNX's own inference on the graph as it is now; nodes of the 'xrt' domain are skipped by it,
and the fusion passes record their outputs' types themselves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import onnx

from ..ir import Graph

if TYPE_CHECKING:
    from . import PassContext


def run(graph: Graph, ctx: PassContext) -> int:
    from ...onnx.export import to_onnx
    from ...onnx.importer import _value

    try:
        model = to_onnx(graph, with_values=False)
        inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
    except Exception:  # inference is best effort: the executor does not depend on it
        return 0
    known = {v.name for v in (*graph.inputs, *graph.outputs)} | set(graph.initializers)
    count = 0
    for info in (*inferred.graph.value_info, *inferred.graph.output):
        value = _value(info)
        if value.name in known and value.name not in graph.output_names():
            continue
        if value.dtype is None and value.shape is None:
            continue
        old = graph.values.get(value.name)
        if old is None or (old.dtype, old.shape) != (value.dtype, value.shape):
            graph.values[value.name] = value
            count += 1
    return count
