"""Linear fusion: MatMul(x, W) + b and Gemm(x, W, b) with a constant weight, followed by Relu or a tanh-form Gelu
or by nothing, become one call of the `linear` op (y = act(x W^T + b)); W^T is stored once as a new constant.
(The `linear` op's "gelu" is the tanh approximation, cuBLASLt's GELU epilogue: an erf-form Gelu stays a node of
its own after the linear.)

Only for GPU graphs: there the cuBLASLt epilogue does the bias (and activation) in the GEMM. On the CPU,
MatMul writing straight into its buffer plus the bias folded into the next elementwise kernel measured
faster than the NumPy linear kernel (which allocates, adds and copies), so CPU graphs keep MatMul + Add.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..ir import Graph, Node
from .util import only_consumer, other_input, remove

if TYPE_CHECKING:
    from . import PassContext

FLOATS = ("float16", "float32", "float64")


def _bias(graph: Graph, name: str, n: int, dtype: str) -> np.ndarray | None:
    b = graph.constant(name)
    if b is None or b.dtype.name != dtype or b.size != n or (b.ndim >= 1 and b.shape[-1] != n):
        return None
    return np.ascontiguousarray(b.reshape(n))


def _from_matmul(graph: Graph, mm: Node, consumers: dict) -> tuple | None:
    w = graph.constant(mm.inputs[1])
    dtype = graph.value(mm.inputs[0]).dtype
    rank = graph.value(mm.inputs[0]).shape
    if w is None or w.ndim != 2 or w.dtype.name != dtype or dtype not in FLOATS or rank is None or len(rank) < 1:
        return None
    add = only_consumer(graph, consumers, mm.outputs[0])
    if add is None or add.op != "Add":
        return None
    bias = _bias(graph, other_input(add, mm.outputs[0]) or "", w.shape[1], dtype)
    if bias is None:
        return None
    return mm.inputs[0], np.ascontiguousarray(w.T), bias, add, [mm, add]


def _from_gemm(graph: Graph, gemm: Node) -> tuple | None:
    at = gemm.attrs
    if at.get("alpha", 1.0) != 1.0 or at.get("beta", 1.0) != 1.0 or at.get("transA", 0):
        return None
    w = graph.constant(gemm.inputs[1])
    dtype = graph.value(gemm.inputs[0]).dtype
    if w is None or w.ndim != 2 or w.dtype.name != dtype or dtype not in FLOATS:
        return None
    weight = np.ascontiguousarray(w if at.get("transB", 0) else w.T)
    bias = None
    if len(gemm.inputs) > 2 and gemm.inputs[2]:
        bias = _bias(graph, gemm.inputs[2], weight.shape[0], dtype)
        if bias is None:
            return None
    return gemm.inputs[0], weight, bias, gemm, [gemm]


def _activation(node: Node) -> str | None:
    """The `linear` op's name for the activation node computes (None: it cannot be an epilogue)."""
    if node.op == "Relu":
        return "relu"
    if node.op == "Gelu" and node.attrs.get("approximate", "none") == "tanh":
        return "gelu"
    return None


def run(graph: Graph, ctx: PassContext) -> int:
    if not ctx.has_op("linear") or ctx.device == "cpu":
        return 0
    changes = 0
    for node in [n for n in graph.nodes if n.op in ("MatMul", "Gemm") and not n.domain]:
        consumers = graph.consumers()
        found = _from_matmul(graph, node, consumers) if node.op == "MatMul" else _from_gemm(graph, node)
        if found is None:
            continue
        x, weight, bias, last, matched = found
        activation = None
        act = only_consumer(graph, consumers, last.outputs[0])
        if act is not None and not act.domain and _activation(act) is not None:
            activation, last, matched = _activation(act), act, [*matched, act]
        inputs = [x, graph.add_constant("linear_weight", weight)]
        inputs.append(graph.add_constant("linear_bias", bias) if bias is not None else "")
        fused = Node("linear", inputs, [last.outputs[0]], {"activation": activation}, graph.fresh_name("Linear"), "xrt")
        remove(graph, matched)
        graph.nodes.append(fused)
        graph.nodes = graph.toposort()
        changes += 1
    return changes
