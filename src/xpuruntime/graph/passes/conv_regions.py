"""CPU convolution regions: a run of consecutive nodes that the CPU's channels-last oneDNN path can all take
becomes one `ConvRegion` node whose `body` holds them (run by onnx/ops/conv_region.py).

On the CPU each Conv otherwise goes through PyTorch's F.conv2d on NCHW arrays, which reorders the weights (and
the activations) into oneDNN's layout on every call, and applies its activation as a second pass. Inside a region
the activations stay channels-last from its inputs to its outputs, each convolution's weights are reordered once
per input shape, and a FusedConv's activation is oneDNN's post-op. MobileNetV3's depthwise convolutions gain the
most (a 16-channel 3x3 one at 112x112: 1.1 -> 0.085 ms on one core).

Taken: Conv and FusedConv in 2-D (constant weights and bias, symmetric explicit pads, any group and dilation,
any FusedConv activation, Clip with finite bounds), Relu, Sigmoid, Tanh, HardSwish, HardSigmoid,
GlobalAveragePool and a ReduceMean over H and W that keeps them, MaxPool (2-D, symmetric pads, no dilation, no
ceil mode, no indices), and Add and Mul (ONNX's
broadcasting), on float32 tensors whose first input is 4-D; a run becomes a region when it holds at least
MIN_CONVS convolutions. Only where the session runs on the CPU with PyTorch's oneDNN (`semantics.conv_regions`):
the GPU path keeps cuDNN's convolutions.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..ir import Graph, Node, Value

if TYPE_CHECKING:
    from . import PassContext

MIN_CONVS = 2  # a region pays two layout conversions per input and output: worth it from two convolutions


def run(graph: Graph, ctx: PassContext) -> int:
    if ctx.device != "cpu" or not getattr(ctx.semantics, "conv_regions", False):
        return 0
    changes = 0
    runs, current = [], []
    for node in graph.nodes:
        if _takes(graph, node):
            current.append(node)
        else:
            runs.append(current)
            current = []
    runs.append(current)
    for nodes in runs:
        if sum(n.op in ("Conv", "FusedConv") for n in nodes) >= MIN_CONVS:
            _make_region(graph, nodes)
            changes += 1
    return changes


def _make_region(graph: Graph, nodes: list[Node]) -> None:
    """Replace the consecutive `nodes` by one ConvRegion node."""
    produced = {o for n in nodes for o in n.outputs if o}
    inner = [_inner(n) for n in nodes]
    inputs = list(dict.fromkeys(i for n in inner for i in n.inputs if i and i not in produced))
    start = graph.nodes.index(nodes[0])
    later = graph.nodes[start + len(nodes) :]
    read_later = {i for n in later for i in n.inputs} | graph.output_names()
    outputs = [o for n in nodes for o in n.outputs if o in read_later]
    body = Graph(
        inner,
        [graph.value(name) for name in inputs], [graph.value(name) for name in outputs],
        values={o: graph.value(o) for o in produced}, opset=graph.opset, name="conv_region",
    )  # fmt: skip
    region = Node("ConvRegion", inputs, outputs, {"body": body}, graph.fresh_name("ConvRegion"))
    graph.nodes[start : start + len(nodes)] = [region]


UNARY = {"Relu", "Sigmoid", "Tanh", "HardSwish", "HardSigmoid", "GlobalAveragePool"}
BINARY = {"Add", "Mul"}
ACTIVATIONS = {None, "Relu", "Sigmoid", "Tanh", "HardSwish", "HardSigmoid", "LeakyRelu", "Clip"}  # FusedConv's


def _inner(node: Node) -> Node:
    """The node as the region runs it: a ReduceMean over H and W is a GlobalAveragePool (its axes input dropped)."""
    if node.op == "ReduceMean":
        return Node("GlobalAveragePool", [node.inputs[0]], list(node.outputs), {}, node.name)
    return Node(node.op, list(node.inputs), list(node.outputs), dict(node.attrs), node.name)


def _spatial_mean(graph: Graph, node: Node) -> bool:
    """A ReduceMean over the two spatial dims that keeps them (squeeze-excite's pooling, as exporters write it)."""
    if not int(node.attrs.get("keepdims", 1)):
        return False
    axes = node.attrs.get("axes")
    if axes is None and len(node.inputs) > 1 and node.inputs[1]:
        constant = graph.constant(node.inputs[1])
        axes = None if constant is None else constant.tolist()
    return axes is not None and sorted(int(a) % 4 for a in axes) == [2, 3]


def _takes(graph: Graph, node: Node) -> bool:
    """Whether a region can run `node` (module docstring)."""
    if node.domain or not node.inputs or not _float4d(graph.value(node.inputs[0])):
        return False
    if node.op in ("Conv", "FusedConv"):
        return _conv(graph, node)
    if node.op in UNARY:
        return True
    if node.op in BINARY:  # ONNX's broadcasting is PyTorch's
        other = graph.value(node.inputs[1]) if len(node.inputs) == 2 else Value("")
        return other.dtype == "float32" and other.shape is not None and len(other.shape) <= 4
    if node.op == "MaxPool":
        return _max_pool(node)
    return node.op == "ReduceMean" and _spatial_mean(graph, node)


def _float4d(value: Value) -> bool:
    return value.dtype == "float32" and value.shape is not None and len(value.shape) == 4


def _conv(graph: Graph, node: Node) -> bool:
    weight = graph.constant(node.inputs[1]) if len(node.inputs) > 1 else None
    bias_name = node.inputs[2] if len(node.inputs) > 2 else ""
    if weight is None or weight.ndim != 4 or (bias_name and graph.constant(bias_name) is None):
        return False
    if len(node.inputs) > 3 and node.inputs[3]:  # a residual Z (made on the GPU only): not the region's form
        return False
    if node.attrs.get("activation") not in ACTIVATIONS:
        return False
    params = [float(p) for p in node.attrs.get("activation_params", ())]
    if node.attrs.get("activation") == "Clip" and not all(math.isfinite(p) for p in params):
        return False  # oneDNN's clip takes finite bounds
    return _explicit_symmetric(node)


def _max_pool(node: Node) -> bool:
    kernel = node.attrs.get("kernel_shape", ())
    if len(kernel) != 2 or int(node.attrs.get("ceil_mode", 0)) or int(node.attrs.get("storage_order", 0)):
        return False
    if any(int(d) != 1 for d in node.attrs.get("dilations", (1, 1))) or len([o for o in node.outputs if o]) != 1:
        return False
    return _explicit_symmetric(node)


def _explicit_symmetric(node: Node) -> bool:
    """No auto_pad, and pads (begin..., end...) equal at both ends of each spatial dim."""
    if node.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
        return False
    pads = [int(p) for p in node.attrs.get("pads", (0, 0, 0, 0))]
    return len(pads) == 4 and pads[:2] == pads[2:]
