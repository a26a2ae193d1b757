"""Old-opset node forms rewritten, at load time, into the forms the op map, the graph passes and the GPU
builders run: what a later version made an input becomes a constant input, defaults that changed between
versions are written out, and legacy broadcasting (opset 1 to 6: `broadcast=1` with an `axis`) becomes
NumPy-style broadcasting by giving B trailing dims of size 1.

Also rewritten: Pad-1/2's pads and value, TopK-1's k and Upsample-1/7's scales (attributes made constant
inputs).

Forms the op map reads directly for every opset (Slice-1 bounds, Squeeze/Unsqueeze/Reduce axes and Split
sizes as attributes, Tile-1's tiles and axis, Softmax's 2-D coercion before 13, PRelu-1/6's per-channel
slope, which needs the input's rank and so is aligned per run) are left as they are.
"""

from __future__ import annotations

import numpy as np
import onnx

from ..graph.ir import Graph, GraphError, Node
from .errors import UnsupportedModelError

# ops whose opset 1-6 versions broadcast B onto A only with broadcast=1, aligned at `axis` when given
LEGACY_BROADCAST = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "And", "Or", "Xor", "Equal", "Greater", "Less"})
FLOAT_MAX = float(np.finfo(np.float32).max)
SELU_1_DEFAULTS = {"alpha": float(np.float32(1.6732)), "gamma": float(np.float32(1.0507))}  # Selu-6: more digits


def upgrade(graph: Graph, model: onnx.ModelProto) -> None:
    """Rewrite the graph's old-opset nodes in place (graph.opset is the model's default-domain opset)."""
    opset = graph.opset
    if opset >= 11:
        return
    ranks = _Ranks(graph, model)
    for node in list(graph.nodes):
        if node.domain:
            continue
        if node.op == "Reshape" and opset < 5:
            _reshape_1(graph, node)
        elif node.op == "Concat" and opset < 4:
            node.attrs.setdefault("axis", 1)
        elif node.op == "Selu" and opset < 6:
            for key, value in SELU_1_DEFAULTS.items():
                node.attrs.setdefault(key, value)
        elif node.op == "Clip" and 6 <= opset < 11:  # Clip-6 clamps to the float range by default
            node.attrs.setdefault("min", -FLOAT_MAX)
            node.attrs.setdefault("max", FLOAT_MAX)
        elif node.op in LEGACY_BROADCAST and opset < 7:
            _legacy_broadcast(graph, node, ranks)
        elif node.op == "Pad":  # Pad-1 and Pad-2 (opset < 11)
            _pad_2(graph, node)
        elif node.op == "TopK" and opset < 10:
            _topk_1(graph, node)
        elif node.op == "Upsample" and opset < 9:
            _upsample_7(graph, node)


def _reshape_1(graph: Graph, node: Node) -> None:
    """Reshape-1 .. Reshape-4: the target is the `shape` attribute; later versions take it as input 1."""
    node.attrs.pop("consumed_inputs", None)
    shape = node.attrs.pop("shape", None)
    if shape is None:
        raise GraphError(f"{node.describe()}: Reshape before opset 5 needs its 'shape' attribute")
    target = graph.add_constant(f"{node.name}_shape", np.array(list(shape), np.int64).reshape(-1))
    node.inputs = [node.inputs[0], target]


def _legacy_broadcast(graph: Graph, node: Node, ranks: _Ranks) -> None:
    """Without broadcast=1, A and B have one shape; with it and no axis, B matches A's trailing dims (both
    NumPy's rule). With an axis, B's dims sit at A's dims axis, axis+1, ...: B gets trailing 1s."""
    node.attrs.pop("consumed_inputs", None)
    broadcast, axis = node.attrs.pop("broadcast", 0), node.attrs.pop("axis", None)
    if not broadcast or axis is None or len(node.inputs) != 2:
        return
    a, b = node.inputs
    rank_a, rank_b = ranks.of(a), ranks.of(b)
    if rank_a is None or rank_b is None:
        unknown = [name for name, rank in ((a, rank_a), (b, rank_b)) if rank is None]
        raise UnsupportedModelError(
            f"{node.describe()}: broadcast=1 with axis={axis} needs the ranks of its inputs, and the model does "
            f"not declare the shapes of {unknown}"
        )
    axis = axis + rank_a if axis < 0 else axis
    pad = rank_a - axis - rank_b
    if pad < 0 or axis < 0:
        raise GraphError(
            f"{node.describe()}: broadcast axis {axis} does not fit a rank-{rank_b} B into a rank-{rank_a} A"
        )
    if pad == 0:
        return
    # an Unsqueeze even for a constant B: folded while optimizing or planning, and right for a fed one
    aligned = graph.fresh_name(f"{b}_aligned")
    unsqueeze = Node("Unsqueeze", [b], [aligned], {"axes": list(range(rank_b, rank_b + pad))}, aligned)
    graph.nodes.insert(graph.nodes.index(node), unsqueeze)  # Unsqueeze-1: axes is an attribute
    node.inputs[1] = aligned


def _pad_2(graph: Graph, node: Node) -> None:
    """Pad-1 (`paddings`) and Pad-2 (`pads`) with a `value` attribute -> Pad-11's pads and constant_value
    inputs (`mode` stays an attribute)."""
    pads = node.attrs.pop("pads", node.attrs.pop("paddings", None))
    if pads is None:
        raise GraphError(f"{node.describe()}: Pad before opset 11 needs its 'pads' attribute")
    dtype = graph.value(node.inputs[0]).dtype or "float32"
    value = np.array(node.attrs.pop("value", 0.0), dtype)
    target = graph.add_constant(f"{node.name}_pads", np.array(list(pads), np.int64))
    node.inputs = [node.inputs[0], target, graph.add_constant(f"{node.name}_value", value)]


def _topk_1(graph: Graph, node: Node) -> None:
    """TopK-1: k is an attribute; from opset 10 it is a 1-D input."""
    k = node.attrs.pop("k", None)
    if k is None:
        raise GraphError(f"{node.describe()}: TopK before opset 10 needs its 'k' attribute")
    node.inputs = [node.inputs[0], graph.add_constant(f"{node.name}_k", np.array([k], np.int64))]


def _upsample_7(graph: Graph, node: Node) -> None:
    """Upsample-7's `scales` attribute, and experimental Upsample-1's height_scale and width_scale on an
    NCHW input with mode 'bilinear', -> Upsample-9's scales input (mode 'nearest' or 'linear')."""
    scales = node.attrs.pop("scales", None)
    if scales is None:
        height, width = node.attrs.pop("height_scale", None), node.attrs.pop("width_scale", None)
        if height is None or width is None:
            raise GraphError(f"{node.describe()}: Upsample before opset 9 needs 'scales' (or height_scale and "
                             "width_scale)")  # fmt: skip
        scales = [1.0, 1.0, height, width]
    if node.attrs.get("mode") == "bilinear":
        node.attrs["mode"] = "linear"
    node.inputs = [node.inputs[0], graph.add_constant(f"{node.name}_scales", np.array(scales, np.float32))]


# ops whose output has the rank of their first input (at opsets 1 to 6, where these rewrites apply)
SAME_RANK = frozenset({
    "Abs", "Cast", "Ceil", "Clip", "Elu", "Exp", "Floor", "HardSigmoid", "Identity", "LeakyRelu", "Log",
    "LogSoftmax", "Max", "Mean", "Min", "Neg", "Not", "PRelu", "Reciprocal", "Relu", "Selu", "Sigmoid",
    "Softmax", "Softplus", "Softsign", "Sqrt", "Sum", "Tanh",
}) | LEGACY_BROADCAST  # fmt: skip


class _Ranks:
    """Ranks of values, worked out once when first asked: initializers and declared types, ONNX shape
    inference, then a walk through the nodes for the ops ONNX has no inference for at opset 1."""

    def __init__(self, graph: Graph, model: onnx.ModelProto) -> None:
        self.graph, self.model = graph, model
        self.ranks: dict[str, int] | None = None

    def of(self, name: str) -> int | None:
        if self.ranks is None:
            self.ranks = self._work_out()
        return self.ranks.get(name)

    def _work_out(self) -> dict[str, int]:
        graph = self.graph
        ranks = _inferred_ranks(self.model)
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
