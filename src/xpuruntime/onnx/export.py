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


def _attr(node: Node, key: str, value: Any, with_values: bool) -> Any:
    if isinstance(value, Graph):
        return _graph_proto(value, with_values)
    if node.domain:
        return repr(value) if not isinstance(value, int | float | str) or isinstance(value, bool) else value
    if node.op == "Cast" and key == "to":
        return _elem_type(value)
    if isinstance(value, np.ndarray):
        return numpy_helper.from_array(value)
    return value


def _nodes(node: Node, with_values: bool) -> list[onnx.NodeProto]:
    """The node as ONNX writes it: without its implicit inputs (its subgraphs name those themselves), after an
    Identity for each one a pass renamed."""
    implicit = node.implicit_inputs()
    declared = node.inputs[: len(node.inputs) - len(implicit)]
    bridges = [
        helper.make_node("Identity", [current], [wanted], name=f"{node.name}_{wanted}_bridge")
        for current, wanted in zip(node.inputs[len(declared) :], implicit)
        if current != wanted
    ]
    attrs = {
        k: _attr(node, k, v, with_values)
        for k, v in node.attrs.items()
        if v is not None and not (isinstance(v, list | tuple) and not v)
    }  # fmt: skip  (ONNX cannot type [])
    made = helper.make_node(node.op, declared, node.outputs, name=node.name, domain=node.domain or None, **attrs)
    return [*bridges, made]


def _graph_proto(graph: Graph, with_values: bool, typed_only_above: int | None = None) -> onnx.GraphProto:
    """The graph as ONNX. Initializers of more than `typed_only_above` elements are declared as typed graph inputs
    without their data (what shape inference needs of weights: a model's gigabyte of them would be copied twice,
    serialized and parsed for nothing)."""
    big = {k for k, a in graph.initializers.items() if typed_only_above is not None and a.size > typed_only_above}
    nodes = [proto for node in graph.nodes for proto in _nodes(node, with_values)]
    inits = [numpy_helper.from_array(np.asarray(a), name) for name, a in graph.initializers.items() if name not in big]
    weights = [_value_info(Value(name, graph.initializers[name].dtype.name, graph.initializers[name].shape))
               for name in big]  # fmt: skip
    value_info = [_value_info(v) for v in graph.values.values()] if with_values else []
    return helper.make_graph(
        nodes, graph.name, [_value_info(v) for v in graph.inputs] + weights, [_value_info(v) for v in graph.outputs],
        inits, value_info=value_info,
    )  # fmt: skip


def to_onnx(graph: Graph, with_values: bool = True, typed_only_above: int | None = None) -> onnx.ModelProto:
    """The graph as an ONNX model (opset of the graph, plus domain 'xrt' version 1 if used); see `_graph_proto`
    for `typed_only_above`."""
    opsets = [helper.make_opsetid("", graph.opset)]
    if any(n.domain for n in graph.nodes):
        opsets.append(helper.make_opsetid("xrt", 1))
    proto = _graph_proto(graph, with_values, typed_only_above)
    return helper.make_model(proto, opset_imports=opsets, producer_name="xpuruntime")


def save_graph(graph: Graph, path: str) -> None:
    """Write the (optimized) graph as an ONNX file."""
    onnx.save(to_onnx(graph), path)
