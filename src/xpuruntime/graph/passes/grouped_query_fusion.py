"""Grouped-query attention fusion: Hugging Face's `repeat_kv` before a fused attention,

    k_rep = Reshape(Expand(Unsqueeze(k, [2]), (B, Hk, n, S, D)), (B, Hk * n, S, D))     (and v alike)

is dropped and the attention reads k and v with their own Hk heads (`enable_gqa`: query head h reads key/value
head h // n), which copied each of them once a layer. Shapes come from shape inference: the Expand's Hk and n and
the head dim must be known numbers, and q's heads Hk * n where known (exporters often leave q's and k's heads
symbolic: a Reshape to (B, S, -1, D)). k's own heads are Hk, or 1 (the Expand broadcasts it): either way each
query head reads the key head the graph gave it, for the op groups q's heads by k's at run time. A q whose heads
turn out not to be Hk * n could only have one head broadcast against k's in the graph; the op refuses that
(heads must divide q's), and the session raises instead of answering.

GPU graphs in half precision only, where flash_v2 reads grouped heads in place; PyTorch's fused kernels decline
grouped heads, and float32 would go from the memory-efficient kernel to SDPA's math one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..ir import Graph, Node
from .util import int_list

if TYPE_CHECKING:
    from . import PassContext

DEVICES = ("cuda",)
DTYPES = ("float16", "bfloat16")


def _repeated(graph: Graph, name: str, producers: dict) -> tuple[str, int] | None:
    """(x, n) when `name` is x (B, Hk, S, D) with each head repeated n times by Unsqueeze / Expand / Reshape."""
    reshape = producers.get(name)
    expand = producers.get(reshape.inputs[0]) if reshape is not None and reshape.op == "Reshape" else None
    unsqueeze = producers.get(expand.inputs[0]) if expand is not None and expand.op == "Expand" else None
    if unsqueeze is None or unsqueeze.op != "Unsqueeze" or any(n.domain for n in (reshape, expand, unsqueeze)):
        return None
    axes = unsqueeze.attrs.get("axes") if len(unsqueeze.inputs) < 2 else int_list(graph, unsqueeze.inputs[1])
    x = unsqueeze.inputs[0]
    shape, wide, out = (graph.value(n).shape for n in (x, expand.outputs[0], name))
    if list(axes or []) != [2] or shape is None or wide is None or out is None or len(shape) != 4 or len(wide) != 5:
        return None
    heads, n, width = wide[1], wide[2], shape[3]
    if not all(isinstance(d, int) for d in (heads, n, width)) or len(out) != 4:
        return None
    if isinstance(shape[1], int) and shape[1] not in (heads, 1):
        return None
    return (x, n) if out[1] == heads * n and width == wide[4] == out[3] else None


def _regroup(graph: Graph, attention: Node, producers: dict) -> bool:
    q = graph.value(attention.inputs[0])
    if q.dtype not in DTYPES or q.shape is None or len(q.shape) != 4 or attention.attrs.get("enable_gqa"):
        return False
    k, v = (_repeated(graph, name, producers) for name in attention.inputs[1:3])
    if k is None or v is None or k[1] != v[1] or k[1] < 2:
        return False
    if isinstance(q.shape[1], int) and q.shape[1] != graph.value(attention.inputs[1]).shape[1]:
        return False  # q's heads broadcast against k's: not grouped-query attention
    attention.inputs[1:3] = [k[0], v[0]]
    attention.attrs["enable_gqa"] = True
    return True


def run(graph: Graph, ctx: PassContext) -> int:
    if ctx.device not in DEVICES:
        return 0
    producers = graph.producers()
    return sum(_regroup(graph, n, producers) for n in graph.nodes if n.op == "attention" and n.domain == "xrt")
