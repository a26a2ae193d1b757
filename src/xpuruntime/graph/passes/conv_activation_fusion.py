"""Conv + activation fusion: a Conv whose output only an activation reads becomes one `FusedConv` node (the
name and attributes of onnxruntime's com.microsoft contrib op: `activation`, `activation_params`), which applies
the activation in place on the convolution's output instead of writing and reading a second tensor.

Activations: Relu, LeakyRelu (alpha), Sigmoid, Tanh, HardSigmoid (alpha, beta), HardSwish, and Clip with constant
bounds (inputs from opset 11, attributes before). CNNs exported by either PyTorch exporter have one after most
convolutions (ResNet's ReLUs, MobileNetV3's HardSwish and ReLU).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..ir import Graph, Node
from .util import only_consumer, remove, scalar

if TYPE_CHECKING:
    from . import PassContext

SIMPLE = {"Relu", "Sigmoid", "Tanh", "HardSwish"}


def _activation(graph: Graph, node: Node) -> tuple[str, list[float]] | None:
    """(activation, its parameters) for an activation node the fused op can apply, else None."""
    if node.domain or len([o for o in node.outputs if o]) != 1:
        return None
    if node.op in SIMPLE:
        return node.op, []
    if node.op == "LeakyRelu":
        return "LeakyRelu", [float(node.attrs.get("alpha", 0.01))]
    if node.op == "HardSigmoid":
        return "HardSigmoid", [float(node.attrs.get("alpha", 0.2)), float(node.attrs.get("beta", 0.5))]
    if node.op == "Clip":
        return _clip(graph, node)
    return None


def _clip(graph: Graph, node: Node) -> tuple[str, list[float]] | None:
    if "min" in node.attrs or "max" in node.attrs:  # opset < 11
        low, high = node.attrs.get("min", float("-inf")), node.attrs.get("max", float("inf"))
        return "Clip", [float(low), float(high)]
    bounds = []
    for position, default in ((1, float("-inf")), (2, float("inf"))):
        name = node.inputs[position] if len(node.inputs) > position else ""
        value = scalar(graph, name) if name else default
        if value is None:  # a bound computed at run time
            return None
        bounds.append(float(value))
    return "Clip", bounds


def run(graph: Graph, ctx: PassContext) -> int:
    changes = 0
    consumers = graph.consumers()
    for conv in [n for n in graph.nodes if n.op == "Conv" and not n.domain]:
        act = only_consumer(graph, consumers, conv.outputs[0])
        if act is None or not act.inputs or act.inputs[0] != conv.outputs[0]:
            continue
        found = _activation(graph, act)
        if found is None:
            continue
        activation, params = found
        attrs = {**conv.attrs, "activation": activation, "activation_params": params}
        fused = Node("FusedConv", list(conv.inputs), [act.outputs[0]], attrs, graph.fresh_name("FusedConv"))
        at = graph.nodes.index(conv)
        remove(graph, [conv, act])
        graph.nodes.insert(min(at, len(graph.nodes)), fused)
        changes += 1
    return changes
