"""Elementwise fusion: maximal chains of float elementwise nodes become one `fused_elementwise` node
whose program (see xpuruntime.ops.fused_elementwise) is run by one generated kernel.

A group grows backwards from its last node, absorbing a producer when every reader of the producer's
output is already in the group (so the group has one output and the graph stays acyclic). Scalar
constants are inlined into the program; other constants and values become the node's inputs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...ops.fused_elementwise import MAX_INPUTS
from ..ir import Graph, Node

if TYPE_CHECKING:
    from . import PassContext

FLOATS = ("float16", "float32", "float64")
UNARY = {
    "Neg": "neg", "Abs": "abs", "Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Reciprocal": "reciprocal",
    "Tanh": "tanh", "Erf": "erf", "Sigmoid": "sigmoid", "Relu": "relu", "Sin": "sin", "Cos": "cos",
    "Identity": "copy", "Cast": "copy",
}  # fmt: skip
EXACT_IN_FLOAT16 = ("float16", "bool", "int8", "uint8")  # Cast from these to float16 never rounds
BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow", "Max": "max", "Min": "min"}


def _instruction_name(node: Node) -> str | None:
    if node.domain:
        return None
    if node.op == "Gelu":
        return "gelu_tanh" if node.attrs.get("approximate", "none") == "tanh" else "gelu"
    if node.op in UNARY and len(node.inputs) == 1:
        return UNARY[node.op]
    if node.op in BINARY and len(node.inputs) == 2 and all(node.inputs):
        return BINARY[node.op]
    return None


def _fusible(graph: Graph, node: Node) -> str | None:
    """The node's output dtype when it can join a fused group, else None."""
    if _instruction_name(node) is None or len(node.outputs) != 1:
        return None
    dtype = graph.value(node.outputs[0]).dtype
    if dtype not in FLOATS:
        return None
    ins = [graph.value(n).dtype for n in node.inputs]
    if None in ins:
        return None
    if node.op == "Cast":  # float16 programs compute in float32: a Cast to float16 must round on its own
        return dtype if dtype != "float16" or ins[0] in EXACT_IN_FLOAT16 else None
    if node.op == "Pow":
        return dtype if ins[0] == dtype else None
    return dtype if all(d == dtype for d in ins) else None


def _inline(graph: Graph, name: str, out_rank: int | None) -> float | None:
    """A size-1 float/int constant that does not widen the output's rank, as a Python float."""
    array = graph.constant(name)
    if array is None or array.size != 1 or array.dtype.kind not in "fiub":
        return None
    if array.ndim and (out_rank is None or array.ndim > out_rank):
        return None
    return float(array.reshape(-1)[0])


def _grow(
    graph: Graph, sink: Node, dtype: str, producers: dict, consumers: dict, taken: set, order: dict
) -> list[Node]:
    """The group that ends at `sink`, grown backwards (linear in its size: the group's external inputs are
    kept up to date as nodes join, never recounted)."""
    group, members = [sink], {id(sink)}
    outputs = graph.output_names()
    externals = dict.fromkeys(n for n in sink.inputs if _inline(graph, n, None) is None)  # ordered set
    frontier = list(sink.inputs)
    while frontier:
        name = frontier.pop()
        node = producers.get(name)
        if node is None or id(node) in members or id(node) in taken or _fusible(graph, node) != dtype:
            continue
        if name in outputs or any(id(u) not in members for u in consumers.get(name, [])):
            continue
        joined = dict(externals)
        joined.pop(name, None)
        joined.update((n, None) for n in node.inputs if n not in joined and _inline(graph, n, None) is None)
        if len(joined) > MAX_INPUTS:
            continue
        externals = joined
        group.append(node)
        members.add(id(node))
        frontier.extend(node.inputs)
    return sorted(group, key=lambda n: order[id(n)])


def _external_inputs(graph: Graph, group: list[Node], out_rank: int | None = None) -> list[str]:
    produced = {o for n in group for o in n.outputs}
    names: list[str] = []
    for node in group:
        for name in node.inputs:
            if name not in produced and name not in names and _inline(graph, name, out_rank) is None:
                names.append(name)
    return names


def _program(graph: Graph, group: list[Node], out_rank: int | None) -> tuple[tuple, list[str]]:
    inputs = _external_inputs(graph, group, out_rank)
    index = {node.outputs[0]: j for j, node in enumerate(group)}
    program = []
    for node in group:
        refs = []
        for name in node.inputs:
            if name in index:
                refs.append(("t", index[name]))
            elif name in inputs:
                refs.append(("in", inputs.index(name)))
            else:
                refs.append(("c", _inline(graph, name, out_rank)))
        program.append((_instruction_name(node), *refs))
    return tuple(program), inputs


def run(graph: Graph, ctx: PassContext) -> int:
    if not ctx.has_op("fused_elementwise"):
        return 0
    producers, consumers = graph.producers(), graph.consumers()
    order = {id(n): i for i, n in enumerate(graph.nodes)}
    names = graph.taken_names()
    taken: set[int] = set()
    replacements: dict[int, Node] = {}
    fused = 0
    for sink in reversed(graph.nodes):
        dtype = _fusible(graph, sink)
        if dtype is None or id(sink) in taken:
            continue
        group = _grow(graph, sink, dtype, producers, consumers, taken, order)
        out_shape = graph.value(sink.outputs[0]).shape
        out_rank = None if out_shape is None else len(out_shape)
        program, inputs = _program(graph, group, out_rank)
        if not inputs:  # all constants: constant folding's business
            continue
        taken.update(id(n) for n in group)
        node = Node("fused_elementwise", inputs, [sink.outputs[0]], {"program": program, "dtype": dtype},
                    graph.fresh_name("Fused", names), "xrt")  # fmt: skip
        replacements[id(sink)] = node
        fused += 1
    graph.nodes = [replacements.get(id(n), n) for n in graph.nodes if id(n) not in taken or id(n) in replacements]
    graph.nodes = graph.toposort()
    return fused
