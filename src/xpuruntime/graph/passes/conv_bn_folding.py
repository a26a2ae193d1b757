"""Conv + BatchNormalization folding: an inference BatchNormalization whose input is a Conv read by nothing else, with
constant weights and statistics, is folded into the Conv's weight and bias (the dynamo exporter leaves every BN of
a CNN as its own node; the TorchScript exporter folds them itself):

    s = scale / sqrt(var + eps);   W' = W * s (per output channel);   b' = (b - mean) * s + B
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..ir import Graph, Node
from .util import only_consumer, remove

if TYPE_CHECKING:
    from . import PassContext


def _folded(graph: Graph, conv: Node, bn: Node) -> tuple[np.ndarray, np.ndarray] | None:
    """The Conv's new weight and bias, or None when something is not a constant of matching size."""
    weight = graph.constant(conv.inputs[1]) if len(conv.inputs) > 1 else None
    stats = [graph.constant(name) for name in bn.inputs[1:5]]
    if weight is None or weight.dtype.kind != "f" or weight.ndim < 3 or any(a is None for a in stats):
        return None
    channels = weight.shape[0]
    scale, shift, mean, var = (np.asarray(a, np.float64).reshape(-1) for a in stats)
    if any(a.size != channels for a in (scale, shift, mean, var)):
        return None
    bias = graph.constant(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] else np.zeros(channels)
    if bias is None or bias.size != channels:
        return None
    s = scale / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
    new_weight = (weight.astype(np.float64) * s.reshape(-1, *(1,) * (weight.ndim - 1))).astype(weight.dtype)
    new_bias = ((np.asarray(bias, np.float64).reshape(-1) - mean) * s + shift).astype(weight.dtype)
    return new_weight, new_bias


def run(graph: Graph, ctx: PassContext) -> int:
    changes = 0
    consumers = graph.consumers()
    for conv in [n for n in graph.nodes if n.op == "Conv" and not n.domain]:
        bn = only_consumer(graph, consumers, conv.outputs[0])
        if bn is None or bn.op != "BatchNormalization" or bn.domain or len([o for o in bn.outputs if o]) != 1:
            continue
        if bn.attrs.get("training_mode", 0) or bn.inputs[0] != conv.outputs[0]:
            continue
        folded = _folded(graph, conv, bn)
        if folded is None:
            continue
        weight, bias = folded
        conv.inputs = [conv.inputs[0], graph.add_constant("folded_w", weight), graph.add_constant("folded_b", bias)]
        conv.outputs = [bn.outputs[0]]
        remove(graph, [bn])
        changes += 1
    return changes
