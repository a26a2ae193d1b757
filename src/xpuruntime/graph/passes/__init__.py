"""Graph optimization passes and the pipeline that runs them at a graph optimization level.

Each pass is a function `(graph, ctx) -> number of changes` in its own module; it edits the graph in
place and must never change what the graph computes. Levels (as onnxruntime's): 0 disabled (shape
inference only), 1 basic (folding, Conv + BatchNorm folding, CSE, cleanups, dead nodes), 2 extended
(+ pattern fusion into registered ops: GELU, layer norm, RMS norm, residual add + norm, attention, rotary
embedding, grouped-query attention, linear; Conv + activation into FusedConv), 99 all (+ MatMul packing,
elementwise fusion).

The passes know the graph IR, not the format it came from: what they need to know about the ops of that
format (how to compute a node of constants, the types shape inference gives values) comes through
`PassContext.semantics` (the ONNX front end passes `xpuruntime.onnx.semantics.ONNX_SEMANTICS`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ...errors import XpuRuntimeError
from ..ir import Graph, GraphError, Node, Value
from . import (
    add_norm_fusion,
    attention_fusion,
    constant_folding,
    conv_activation_fusion,
    conv_bn_folding,
    conv_regions,
    cse,
    dead_code,
    elementwise_fusion,
    gelu_fusion,
    grouped_query_fusion,
    layer_norm_fusion,
    layout_cleanup,
    linear_fusion,
    matmul_packing,
    rms_norm_fusion,
    rotary_fusion,
    shape_inference,
)  # fmt: skip


class OpSemantics(Protocol):
    """What the passes may ask about the graph's ops (the front end that made the graph answers)."""

    def evaluate(
        self, node: Node, args: list[np.ndarray | None], opset: int, max_elements: int
    ) -> list[np.ndarray] | None:
        """The node's outputs for these constant inputs, or None when it cannot be computed now or an output
        would have more than `max_elements` (estimated before computing)."""

    def infer_types(self, graph: Graph) -> list[Value]:
        """Types (dtype, shape) of values the graph's nodes produce, as far as they can be inferred."""


class NoSemantics:
    """Knows nothing: constant folding folds only shapes that are known, shape inference infers nothing."""

    def evaluate(
        self, node: Node, args: list[np.ndarray | None], opset: int, max_elements: int
    ) -> list[np.ndarray] | None:
        return None

    def infer_types(self, graph: Graph) -> list[Value]:
        return []


@dataclass
class PassContext:
    """What passes may consult: which xrt ops exist (a fusion into a missing op is skipped), the device the
    graph will run on (some fusions pay off only where a fused kernel exists) and the ops' semantics."""

    available_ops: frozenset[str]
    device: str = "cpu"
    semantics: OpSemantics = field(default_factory=NoSemantics)

    def has_op(self, name: str) -> bool:
        return name in self.available_ops


@dataclass(frozen=True)
class PassRecord:
    name: str
    before: int
    after: int
    changes: int


Pass = Callable[[Graph, PassContext], int]
BASIC, EXTENDED, ALL = 1, 2, 99
PIPELINE: tuple[tuple[int, str, Pass], ...] = (
    (0, "shape_inference", shape_inference.run),
    (BASIC, "constant_folding", constant_folding.run),
    (BASIC, "conv_bn_folding", conv_bn_folding.run),
    (BASIC, "layout_cleanup", layout_cleanup.run),
    (BASIC, "cse", cse.run),
    (BASIC, "dead_code", dead_code.run),
    (EXTENDED, "gelu_fusion", gelu_fusion.run),
    (EXTENDED, "layer_norm_fusion", layer_norm_fusion.run),
    (EXTENDED, "rms_norm_fusion", rms_norm_fusion.run),
    (EXTENDED, "add_norm_fusion", add_norm_fusion.run),
    (EXTENDED, "attention_fusion", attention_fusion.run),
    (EXTENDED, "rotary_fusion", rotary_fusion.run),
    (EXTENDED, "grouped_query_fusion", grouped_query_fusion.run),
    (EXTENDED, "linear_fusion", linear_fusion.run),
    (EXTENDED, "conv_activation_fusion", conv_activation_fusion.run),
    (ALL, "matmul_packing", matmul_packing.run),
    (ALL, "conv_regions", conv_regions.run),
    (ALL, "elementwise_fusion", elementwise_fusion.run),
    (BASIC, "dead_code", dead_code.run),
)


def optimize(
    graph: Graph, level: int, dispatcher: Any = None, device: str = "cpu", semantics: OpSemantics | None = None
) -> tuple[Graph, list[PassRecord]]:
    """A copy of `graph` with every pass up to `level` applied, and what each pass did."""
    if dispatcher is None:
        from ...dispatch import default_dispatcher

        dispatcher = default_dispatcher()
    ctx = PassContext(frozenset(dispatcher.registry.ops), device.split(":")[0], semantics or NoSemantics())
    work = graph.copy()
    records = []
    for pass_level, name, fn in PIPELINE:
        if int(level) < pass_level:
            continue
        before = len(work.nodes)
        try:
            changes = fn(work, ctx)
        except XpuRuntimeError:
            raise
        except Exception as exc:  # a pass must never crash a session on an odd graph: say which one
            raise GraphError(f"graph pass '{name}' failed on this graph: {type(exc).__name__}: {exc}") from exc
        if changes:
            work.verify()
        records.append(PassRecord(name, before, len(work.nodes), changes))
    return work, records
