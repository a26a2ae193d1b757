"""Attention pattern fusion: the scaled dot-product attention both PyTorch exporters emit becomes one call of the
`attention` op.

    scores = MatMul(q [* a], K^T [* b]) [/ c or * c]     (the exporters scale q and K^T by D^-1/4 each)
    [scores = scores + mask]                             mask: a float mask, or Where(keep, 0, fill)
    p = Softmax(scores, last axis)
    [p = Where(IsNaN(p), 0, p)]                          the exporters' guard for rows that see no key
    out = MatMul(p, v)

becomes out = attention(q, K, v, mask, scale=a*b/c). A Where(keep, 0, -inf) mask becomes the boolean `keep`; one
with a finite fill (HF's finfo.min) stays an additive mask in the model's dtype, so a row that sees no key still
averages v as the graph did. With the guard, the fused output gets it instead: a row whose keys are all masked
(-inf) comes out NaN from the op and 0 from the guard, as from the graph. Under a finite fill no row is all -inf,
so the guard is dropped (two kernels a layer on the GPU): it could then only zero the rows that NaN or infinite q,
k or v turn NaN, which stay NaN. Such a mask is also given as `bounded_mask` (no value below mask_floor: the kernels
skip their per-call scans of it), its fill raised to the floor where it was lower (a new Where, made once per mask
for all the layers that read it): no result changes (the exp of either fill is 0 beside a kept key, and a row of
fills averages v either way).

K comes from K^T: the input of a Transpose that swapped the last two axes (with any permutation before them, a new
Transpose undoing the rest); the dynamo exporter's Reshape(Transpose(Reshape(k, [-1, S, D]), [0, 2, 1]), [..., D, S]),
recognised through the symbolic shapes that shape inference gave its values; otherwise a new Transpose of K^T's
last two axes (always right, one copy more).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from ...ops.attention import mask_floor
from ..ir import Graph, Node, Value
from .util import matches, only_consumer, other_input, remove, scalar

if TYPE_CHECKING:
    from . import PassContext

FLOATS = ("float16", "bfloat16", "float32", "float64")


def _scalar_operand(graph: Graph, node: Node, name: str) -> float | None:
    """The node's other input when it is a one-element constant that does not widen `name`'s rank."""
    other = other_input(node, name)
    array = graph.constant(other or "")
    rank = graph.value(name).shape
    if array is None or (array.ndim and (rank is None or array.ndim > len(rank))):
        return None
    return scalar(graph, other or "")


def _unscaled(graph: Graph, name: str, producers: dict, consumers: dict) -> tuple[str, float, list[Node]]:
    """(x, c, [node]) when `name` is x * c or x / c for a scalar constant c read only here, else (name, 1, [])."""
    node = producers.get(name)
    if node is None or node.domain or node.op not in ("Mul", "Div") or only_consumer(graph, consumers, name) is None:
        return name, 1.0, []
    for x in node.inputs if node.op == "Mul" else node.inputs[:1]:
        c = _scalar_operand(graph, node, x)
        if c is not None and c != 0 and math.isfinite(c) and graph.value(x).dtype == graph.value(name).dtype:
            return x, (c if node.op == "Mul" else 1.0 / c), [node]
    return name, 1.0, []


def _scores(graph: Graph, softmax: Node, producers: dict, consumers: dict) -> tuple | None:
    """Walk back from the Softmax: (scores MatMul, post-scale, mask or None, matched nodes)."""
    name, matched, mask = softmax.inputs[0], [], None
    node = producers.get(name)
    sides = [name]
    if node is not None and node.op == "Add" and not node.domain and only_consumer(graph, consumers, name) is softmax:
        sides, matched = list(node.inputs), [node]
    for side in sides:
        source, post, scaled = _unscaled(graph, side, producers, consumers)
        scores = producers.get(source)
        if scores is not None and scores.op == "MatMul" and not scores.domain:
            if only_consumer(graph, consumers, source) is None:
                return None
            mask = other_input(node, side) if matched else None
            return scores, post, mask, [scores, *scaled, *matched]
    return None


def _probabilities(graph: Graph, softmax: Node, consumers: dict) -> tuple[Node, bool, list[Node]] | None:
    """From the Softmax to the MatMul with v: (that MatMul, whether the IsNaN guard sits between, guard nodes)."""
    p = softmax.outputs[0]
    users = consumers.get(p, [])
    if p in graph.output_names():
        return None
    if len(users) == 1 and users[0].op == "MatMul" and users[0].inputs[0] == p:
        return users[0], False, []
    isnan = next((u for u in users if u.op == "IsNaN" and not u.domain), None)
    where = next((u for u in users if u.op == "Where" and not u.domain), None)
    if len(users) != 2 or isnan is None or where is None or where.inputs != [isnan.outputs[0], where.inputs[1], p]:
        return None
    if scalar(graph, where.inputs[1]) != 0.0 or only_consumer(graph, consumers, isnan.outputs[0]) is not where:
        return None
    out = only_consumer(graph, consumers, where.outputs[0])
    if out is None or out.op != "MatMul" or out.inputs[0] != where.outputs[0]:
        return None
    return out, True, [isnan, where]


def _where_fill(graph: Graph, mask: str, producers: dict) -> tuple[str, float] | None:
    """(keep, fill) when the mask is Where(keep, 0, fill) with a boolean keep and a constant fill."""
    where = producers.get(mask)
    if where is None or where.op != "Where" or where.domain or graph.value(where.inputs[0]).dtype != "bool":
        return None
    fill = scalar(graph, where.inputs[2])
    return (where.inputs[0], fill) if scalar(graph, where.inputs[1]) == 0.0 and fill is not None else None


def _mask(graph: Graph, mask: str | None, dtype: str, producers: dict) -> str | None:
    """The attention op's mask: a Where(keep, 0, -inf)'s `keep`, or the additive mask itself ("" for none);
    None when the mask cannot be given to the op (another dtype)."""
    if mask is None:
        return ""
    found = _where_fill(graph, mask, producers)
    if found is not None and found[1] == -math.inf and graph.value(mask).shape == graph.value(found[0]).shape:
        return found[0]
    return mask if graph.value(mask).dtype == dtype else None


def _swaps_last_two(perm: list[int]) -> bool:
    n = len(perm)
    return n >= 2 and perm == [*range(n - 2), n - 1, n - 2]


def _same(a: tuple | None, b: tuple | None) -> bool:
    """Shapes known to be equal: every dim a fixed int or a symbol, pairwise the same."""
    return a is not None and b is not None and len(a) == len(b) and all(x == y and x is not None for x, y in zip(a, b))


def _unflattened_key(graph: Graph, kt: str, producers: dict) -> str | None:
    """k, when kt = Reshape(Transpose(Reshape(k) merging k's leading dims, swapping the last two), splitting
    them back): the dynamo exporter's k.transpose(-2, -1)."""
    outer = producers.get(kt)
    swap = producers.get(outer.inputs[0]) if outer is not None and outer.op == "Reshape" else None
    inner = producers.get(swap.inputs[0]) if swap is not None and swap.op == "Transpose" else None
    if inner is None or inner.op != "Reshape" or not _swaps_last_two(list(swap.attrs.get("perm") or [])):
        return None
    k = inner.inputs[0]
    k_shape, merged, out = graph.value(k).shape, graph.value(inner.outputs[0]).shape, graph.value(kt).shape
    if k_shape is None or merged is None or out is None or len(k_shape) < 2 or len(merged) < 2:
        return None
    if _same(merged[-2:], k_shape[-2:]) and _same(out[:-2], k_shape[:-2]) and _same(out[-2:], k_shape[:-3:-1]):
        return k
    return None


def _key(graph: Graph, kt: str, producers: dict) -> tuple[str, Node | None] | None:
    """(k, a new Transpose node making it, or None) such that k's last two axes swapped give kt."""
    node = producers.get(kt)
    if node is not None and node.op == "Transpose" and not node.domain and node.attrs.get("perm"):
        perm = list(node.attrs["perm"])
        k_perm = [*perm[:-2], perm[-1], perm[-2]]
        if k_perm == list(range(len(perm))):
            return node.inputs[0], None
        name = graph.fresh_name("attn_k")
        return name, Node("Transpose", [node.inputs[0]], [name], {"perm": k_perm}, graph.fresh_name("AttnKey"))
    k = _unflattened_key(graph, kt, producers)
    if k is not None:
        return k, None
    shape = graph.value(kt).shape
    if shape is None or len(shape) < 2:
        return None
    name = graph.fresh_name("attn_k")
    graph.set_value(Value(name, graph.value(kt).dtype, (*shape[:-2], shape[-1], shape[-2])))
    n = len(shape)
    return name, Node("Transpose", [kt], [name], {"perm": [*range(n - 2), n - 1, n - 2]}, graph.fresh_name("AttnKey"))


def _match(graph: Graph, softmax: Node, producers: dict, consumers: dict) -> tuple | None:
    shape = graph.value(softmax.inputs[0]).shape
    axis = softmax.attrs.get("axis", -1 if graph.opset >= 13 else 1)
    if not (axis == -1 or (shape is not None and axis == len(shape) - 1)):
        return None
    found = _scores(graph, softmax, producers, consumers)
    tail = _probabilities(graph, softmax, consumers)
    if found is None or tail is None:
        return None
    scores, post, mask, matched = found
    out, guarded, guard = tail
    (q, a, q_scale), (kt, b, k_scale) = (_unscaled(graph, n, producers, consumers) for n in scores.inputs)
    dtype, v = graph.value(q).dtype, out.inputs[1]
    if dtype not in FLOATS or graph.value(kt).dtype != dtype or graph.value(v).dtype != dtype:
        return None
    op_mask = _mask(graph, mask, dtype, producers)
    if op_mask is None:
        return None
    found = _where_fill(graph, mask, producers) if op_mask == mask else None
    bounded = found is not None and math.isfinite(found[1])  # a finite fill: no row of -inf
    guarded = guarded and not bounded
    nodes = [*q_scale, *k_scale, *matched, softmax, *guard, out]
    return q, kt, v, op_mask, a * b * post, guarded, bounded, out, nodes


def _bounded_mask(graph: Graph, mask: str, made: dict[str, str]) -> str:
    """Where(keep, 0, fill) itself when its fill is at or above mask_floor, else a new Where(keep, 0, floor), made
    once per mask (`made`)."""
    where = graph.producers()[mask]
    fill = graph.constant(where.inputs[2])
    floor = mask_floor(graph.value(mask).dtype)
    if float(fill.reshape(-1)[0]) >= floor:
        return mask
    if mask not in made:
        raised = graph.add_constant("attention_mask_floor", np.full_like(fill, floor))
        made[mask] = graph.fresh_name("attention_mask")
        typed = graph.value(mask)
        graph.set_value(Value(made[mask], typed.dtype, typed.shape))
        graph.nodes.append(Node("Where", [where.inputs[0], where.inputs[1], raised], [made[mask]], {},
                                graph.fresh_name("AttentionMask")))  # fmt: skip
    return made[mask]


def _fuse(graph: Graph, found: tuple, key: tuple[str, Node | None], made: dict[str, str]) -> None:
    q, _, v, mask, scale, guarded, bounded, out, nodes = found
    k, transpose = key
    result = out.outputs[0]
    added = [] if transpose is None else [transpose]
    target = graph.fresh_name("attention") if guarded else result
    attrs = {"is_causal": False, "scale": float(scale)}
    if bounded:
        mask, attrs["bounded_mask"] = _bounded_mask(graph, mask, made), True
    added.append(Node("attention", [q, k, v, mask], [target], attrs, graph.fresh_name("Attention"), "xrt"))
    if guarded:  # rows that saw no key: NaN from the op, 0 from the graph's guard
        typed = graph.value(result)
        graph.set_value(Value(target, typed.dtype, typed.shape))
        isnan = graph.fresh_name("attention_isnan")
        graph.set_value(Value(isnan, "bool", typed.shape))
        zero = graph.add_constant("attention_zero", graph.constant(nodes[-2].inputs[1]).copy())
        added += [Node("IsNaN", [target], [isnan], {}, graph.fresh_name("AttentionGuard")),
                  Node("Where", [isnan, zero, target], [result], {}, graph.fresh_name("AttentionGuard"))]  # fmt: skip
    remove(graph, nodes)
    graph.nodes += added


def run(graph: Graph, ctx: PassContext) -> int:
    if not ctx.has_op("attention"):
        return 0
    changes = 0
    made: dict[str, str] = {}  # a mask -> its Where with the fill raised to mask_floor
    for _, found in matches(graph, ("Softmax",), _match):
        key = _key(graph, found[1], graph.producers())
        if key is None:
            continue
        _fuse(graph, found, key, made)
        graph.nodes = graph.toposort()
        changes += 1
    return changes
