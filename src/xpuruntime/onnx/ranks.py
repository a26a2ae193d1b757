"""Ranks of a model's values where the model makes them known, for load-time rewrites that need them
(legacy broadcasting with an axis): initializers and declared types, ONNX shape inference, then a walk
through the nodes for the ops ONNX has no inference for at opset 1."""

from __future__ import annotations

import onnx

from ..graph.ir import Graph

# ops whose output has the rank of their first input (at opsets 1 to 6, where the rewrites that ask apply)
SAME_RANK = frozenset({
    "Abs", "Add", "And", "Cast", "Ceil", "Clip", "Div", "Elu", "Equal", "Exp", "Floor", "Greater",
    "HardSigmoid", "Identity", "LeakyRelu", "Less", "Log", "LogSoftmax", "Max", "Mean", "Min", "Mul", "Neg",
    "Not", "Or", "PRelu", "Pow", "Reciprocal", "Relu", "Selu", "Sigmoid", "Softmax", "Softplus", "Softsign",
    "Sqrt", "Sub", "Sum", "Tanh", "Xor",
})  # fmt: skip


def known_ranks(graph: Graph, model: onnx.ModelProto | None) -> dict[str, int]:
    """Value name -> rank, for every value whose rank the model makes known."""
    ranks = _inferred_ranks(model) if model is not None else {}
    for v in (*graph.inputs, *graph.outputs, *graph.values.values()):
        if v.shape is not None:
            ranks[v.name] = len(v.shape)
    ranks.update({name: array.ndim for name, array in graph.initializers.items()})
    for node in graph.nodes:
        first = ranks.get(node.inputs[0]) if node.inputs else None
        out = node.outputs[0] if node.outputs else ""
        if first is None or not out or out in ranks or node.domain:
            continue
        if node.op in SAME_RANK:
            ranks[out] = first
        elif node.op == "Reshape" and len(node.inputs) == 2 and graph.constant(node.inputs[1]) is not None:
            ranks[out] = graph.constant(node.inputs[1]).size
    return ranks


def _inferred_ranks(model: onnx.ModelProto) -> dict[str, int]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False)
    except Exception:  # best effort: a value it cannot type stays unknown
        return {}
    ranks = {}
    for info in (*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input):
        tensor = info.type.tensor_type
        if info.type.HasField("tensor_type") and tensor.HasField("shape"):
            ranks[info.name] = len(tensor.shape.dim)
    return ranks
