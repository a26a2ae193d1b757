"""Conv + activation fusion: a Conv whose output only an activation reads becomes one `FusedConv` node (the
name and attributes of onnxruntime's com.microsoft contrib op: `activation`, `activation_params`), which applies
the activation in place on the convolution's output instead of writing and reading a second tensor.

Activations: Relu, LeakyRelu (alpha), Sigmoid, Tanh, HardSigmoid (alpha, beta), HardSwish, and Clip with constant
bounds (inputs from opset 11, attributes before). CNNs exported by either PyTorch exporter have one after most
convolutions (ResNet's ReLUs, MobileNetV3's HardSwish and ReLU).

On the GPU a residual block's last Conv, the Add of the block's input and the Relu after it become one FusedConv
with onnxruntime's fourth input Z, `Y = Relu(Conv(X, W, B) + Z)`: cuDNN computes it in one kernel (channels-last,
`ops.conv`), where the Conv, its bias, the Add and the Relu took three passes over the block's output. (On the CPU
the convolution regions sum residuals into oneDNN's convolutions themselves. Only in the dtypes the GPU path
convolves channels-last: elsewhere FusedConv's in-place add and Relu are two passes where the fused elementwise
kernel is one, as ResNet-50 fp32 B64 showed while float32 convolved NCHW: 9.39 -> 10.1 ms on an H200.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..ir import Graph, Node
from .util import only_consumer, other_input, remove, scalar

if TYPE_CHECKING:
    from . import PassContext

SIMPLE = {"Relu", "Sigmoid", "Tanh", "HardSwish"}
RESIDUAL_DTYPES = ("float16", "bfloat16", "float32")  # the GPU path's channels-last dtypes (cuDNN's fused form)


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
    changes = _fuse_residuals(graph) if ctx.device == "cuda" else 0
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


def _fuse_residuals(graph: Graph) -> int:
    """Conv -> Add(., Z) -> Relu, Z maybe of the Conv output's shape, into FusedConv(X, W, B, Z) with Relu."""
    changes = 0
    consumers = graph.consumers()
    for conv in [n for n in graph.nodes if n.op == "Conv" and not n.domain]:
        add = only_consumer(graph, consumers, conv.outputs[0])
        if add is None or add.op != "Add" or add.domain:
            continue
        residual = other_input(add, conv.outputs[0])
        relu = only_consumer(graph, consumers, add.outputs[0])
        if residual is None or residual == conv.outputs[0] or relu is None or relu.op != "Relu" or relu.domain:
            continue
        out = graph.value(conv.outputs[0])
        if out.dtype not in RESIDUAL_DTYPES or not _may_match(out.shape, graph.value(residual).shape):
            continue
        x, weight, bias = [*conv.inputs, "", ""][:3]
        inputs = [x, weight, bias, residual]
        attrs = {**conv.attrs, "activation": "Relu", "activation_params": []}
        fused = Node("FusedConv", inputs, [relu.outputs[0]], attrs, graph.fresh_name("FusedConv"))
        at = graph.nodes.index(add)  # Z may be made after the Conv: the fused node goes where the Add was
        remove(graph, [conv, add, relu])
        graph.nodes.insert(min(at - 1, len(graph.nodes)), fused)
        consumers = graph.consumers()
        changes += 1
    return changes


def _may_match(shape: tuple | None, other: tuple | None) -> bool:
    """Whether two 4-D shapes can be equal: known dims equal (symbolic ones, such as an exported model's dynamic
    height and width, are often named apart; the FusedConv adds Z by ONNX's broadcasting when they differ)."""
    if shape is None or other is None or len(shape) != 4 or len(other) != 4:
        return False
    return all(a == b for a, b in zip(shape, other) if isinstance(a, int) and isinstance(b, int))
