"""Graph IR -> ONNX ModelProto: for shape inference and for saving the optimized graph.

Nodes of the 'xrt' domain are written with their attributes as strings (a fused program is a tuple),
so a saved optimized model is for inspection (Netron, onnx.checker), not for another runtime.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..graph.ir import Graph, Node, Value


def _elem_type(dtype: str | None) -> int:
    if dtype is None:
        return onnx.TensorProto.UNDEFINED
    try:
        return int(helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
    except Exception:
        return onnx.TensorProto.UNDEFINED


def _value_info(v: Value) -> onnx.ValueInfoProto:
    shape = None if v.shape is None else [d if isinstance(d, int | str) else None for d in v.shape]
    return helper.make_tensor_value_info(v.name, _elem_type(v.dtype), shape)


def _attr(node: Node, key: str, value: Any) -> Any:
    if node.domain:
        return repr(value) if not isinstance(value, int | float | str) or isinstance(value, bool) else value
    if node.op == "Cast" and key == "to":
        return _elem_type(value)
    if isinstance(value, np.ndarray):
        return numpy_helper.from_array(value)
    return value


def to_onnx(graph: Graph, with_values: bool = True, typed_only_above: int | None = None) -> onnx.ModelProto:
    """The graph as an ONNX model (opset of the graph, plus domain 'xrt' version 1 if used). Initializers of more
    than `typed_only_above` elements are declared as typed graph inputs without their data (what shape inference
    needs of weights: a model's gigabyte of them would be copied twice, serialized and parsed for nothing)."""
    big = {k for k, a in graph.initializers.items() if typed_only_above is not None and a.size > typed_only_above}
    nodes = [
        helper.make_node(
            n.op,
            n.inputs,
            n.outputs,
            name=n.name,
            domain=n.domain or None,
            **{k: _attr(n, k, v) for k, v in n.attrs.items() if v is not None},
        )
        for n in graph.nodes
    ]
    inits = [numpy_helper.from_array(np.asarray(a), name) for name, a in graph.initializers.items() if name not in big]
    weights = [_value_info(Value(name, graph.initializers[name].dtype.name, graph.initializers[name].shape))
               for name in big]  # fmt: skip
    value_info = [_value_info(v) for v in graph.values.values()] if with_values else []
    g = helper.make_graph(
        nodes, graph.name, [_value_info(v) for v in graph.inputs] + weights, [_value_info(v) for v in graph.outputs],
        inits, value_info=value_info,
    )  # fmt: skip
    opsets = [helper.make_opsetid("", graph.opset)]
    if any(n.domain for n in graph.nodes):
        opsets.append(helper.make_opsetid("xrt", 1))
    return helper.make_model(g, opset_imports=opsets, producer_name="xpuruntime")


def save_graph(graph: Graph, path: str) -> None:
    """Write the (optimized) graph as an ONNX file."""
    onnx.save(to_onnx(graph), path)
