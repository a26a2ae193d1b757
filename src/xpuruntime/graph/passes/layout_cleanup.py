"""Removal of needless data movement: Identity nodes, Casts to the same dtype, Reshapes to the shape a
value already has, Reshape chains, Transpose pairs that cancel or compose, Unsqueeze+Squeeze pairs,
and the Reshape(to 2-D) -> MatMul or Gemm -> Reshape(back) sandwich exporters put around matmuls (a Gemm's becomes
MatMul + Add, which the linear fusion and MatMul packing then see as any other)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..ir import Graph, Node, Value
from .util import int_list, only_consumer, remove, replace_uses

if TYPE_CHECKING:
    from . import PassContext


def _same_shape(a: tuple | None, b: tuple | None) -> bool:
    return a is not None and b is not None and len(a) == len(b) and all(x == y and x is not None for x, y in zip(a, b))


def _forward(graph: Graph, node: Node) -> bool:
    """Make `node` a no-op: readers of its output read its input instead; for a graph output, the
    producer of the input writes the output directly (when nothing else reads the input)."""
    if replace_uses(graph, node.outputs[0], node.inputs[0]):
        return True
    source, value = graph.producers().get(node.inputs[0]), node.inputs[0]
    if source is None or value in graph.output_names() or len(graph.consumers().get(value, [])) != 1:
        return False
    source.outputs[source.outputs.index(value)] = node.outputs[0]
    return True


def _is_noop(graph: Graph, node: Node) -> bool:
    if node.op == "Identity":
        return True
    if node.op == "Cast":
        return graph.value(node.inputs[0]).dtype == node.attrs.get("to")
    if node.op in ("Reshape", "Squeeze", "Unsqueeze", "Flatten", "Expand"):
        return node.op != "Expand" and _same_shape(
            graph.value(node.inputs[0]).shape, graph.value(node.outputs[0]).shape
        )
    if node.op == "Transpose":
        perm = node.attrs.get("perm")
        return perm is not None and list(perm) == list(range(len(perm)))
    return False


def _merge_pair(graph: Graph, node: Node, consumers: dict) -> bool:
    """Fold `node` into its single consumer when the two compose into one (or none)."""
    user = only_consumer(graph, consumers, node.outputs[0])
    if user is None or user.inputs[:1] != [node.outputs[0]]:
        return False
    if node.op == "Reshape" == user.op:
        target = int_list(graph, user.inputs[1])
        if target is None or (0 in target and not user.attrs.get("allowzero", 0)):
            return False
        user.inputs[0] = node.inputs[0]
        return True
    if node.op == "Transpose" == user.op and node.attrs.get("perm") and user.attrs.get("perm"):
        p1, p2 = list(node.attrs["perm"]), list(user.attrs["perm"])
        user.attrs["perm"] = [p1[i] for i in p2]
        user.inputs[0] = node.inputs[0]
        return True
    if node.op == "Unsqueeze" and user.op == "Squeeze" and len(node.inputs) > 1 and len(user.inputs) > 1:
        a, b = int_list(graph, node.inputs[1]), int_list(graph, user.inputs[1])
        if a is not None and a == b and all(x >= 0 for x in a):
            user.op, user.inputs, user.attrs = "Identity", [node.inputs[0]], {}
            return True
    return False


def _sandwich(graph: Graph, node: Node, consumers: dict, producers: dict, k: int, n: int) -> tuple | None:
    """(first, last) when `node` sits between Reshape(x: [..., K] -> [M, K]) and Reshape(-> [..., N])."""
    first = producers.get(node.inputs[0])
    last = only_consumer(graph, consumers, node.outputs[0])
    if first is None or first.op != "Reshape" or last is None or last.op != "Reshape":
        return None
    x_shape, out_shape = graph.value(first.inputs[0]).shape, graph.value(last.outputs[0]).shape
    if x_shape is None or out_shape is None or len(x_shape) != len(out_shape) or len(x_shape) < 2:
        return None
    if not (_same_shape(x_shape[:-1], out_shape[:-1]) or (x_shape[:-1] == out_shape[:-1] and None not in x_shape)):
        return None
    if x_shape[-1] != k or out_shape[-1] != n or len(consumers.get(first.outputs[0], [])) != 1:
        return None
    return first, last


def _matmul_sandwich(graph: Graph, node: Node, consumers: dict, producers: dict) -> bool:
    """Reshape(x: [..., K] -> [M, K]) -> MatMul(W: [K, N]) -> Reshape(-> [..., N]): MatMul(x, W)."""
    weight = graph.constant(node.inputs[1]) if node.op == "MatMul" else None
    found = None if weight is None or weight.ndim != 2 else _sandwich(graph, node, consumers, producers, *weight.shape)
    if found is None:
        return False
    first, last = found
    node.inputs[0] = first.inputs[0]
    node.outputs[0], last.outputs[0] = last.outputs[0], node.outputs[0]
    last.op, last.inputs, last.attrs = "Identity", [node.outputs[0]], {}
    remove(graph, [last])
    return True


def _gemm_sandwich(graph: Graph, node: Node, consumers: dict, producers: dict) -> bool:
    """Reshape(x -> [M, K]) -> Gemm(W, b) -> Reshape(-> [..., N]) (GPT-2's Conv1D): MatMul(x, W) + b."""
    at = node.attrs
    if node.op != "Gemm" or at.get("alpha", 1.0) != 1.0 or at.get("beta", 1.0) != 1.0 or at.get("transA", 0):
        return False
    weight = graph.constant(node.inputs[1])
    bias = graph.constant(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
    if weight is None or weight.ndim != 2:
        return False
    weight = weight.T if at.get("transB", 0) else weight
    if bias is not None and (bias.size != weight.shape[1] or bias.shape[-1:] != weight.shape[1:] or bias.ndim > 2):
        return False
    found = _sandwich(graph, node, consumers, producers, *weight.shape)
    if found is None:
        return False
    first, last = found
    w = graph.add_constant("gemm_weight", np.ascontiguousarray(weight)) if at.get("transB", 0) else node.inputs[1]
    product = last.outputs[0] if bias is None else graph.fresh_name("gemm_product")
    node.op, node.inputs, node.outputs, node.attrs = "MatMul", [first.inputs[0], w], [product], {}
    if bias is None:
        remove(graph, [last])
    else:
        b = graph.add_constant("gemm_bias", np.ascontiguousarray(bias.reshape(-1)))
        last.op, last.inputs, last.attrs = "Add", [product, b], {}
        typed = graph.value(last.outputs[0])
        graph.set_value(Value(product, typed.dtype, typed.shape))
    return True


def _merged(graph: Graph, node: Node, consumers: dict, producers: dict) -> bool:
    if node.op in ("Reshape", "Transpose", "Unsqueeze") and _merge_pair(graph, node, consumers):
        return True
    return _matmul_sandwich(graph, node, consumers, producers) or _gemm_sandwich(graph, node, consumers, producers)


def run(graph: Graph, ctx: PassContext) -> int:
    changes = 0
    progress = True
    while progress:
        progress = False
        consumers, producers = graph.consumers(), graph.producers()
        for node in list(graph.nodes):
            if node.domain or not node.inputs:
                continue
            if _is_noop(graph, node) and _forward(graph, node):
                remove(graph, [node])
            elif not _merged(graph, node, consumers, producers):
                continue
            changes += 1
            progress = True
            break
    return changes


__all__ = ["np", "run"]
