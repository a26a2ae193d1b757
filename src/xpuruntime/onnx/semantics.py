"""What the graph passes need to know about ONNX ops, given to them through `PassContext.semantics` (the
passes know the graph IR, not the importer): how to compute a node from constant inputs (constant folding)
and the types ONNX's shape inference gives the graph's values."""

from __future__ import annotations

import math

import numpy as np
import onnx

from ..graph.ir import Graph, Node, Value
from .export import to_onnx
from .importer import value_of
from .ops import OPS

SHAPE_DATA_ELEMENTS = 4096  # constants up to this size go to shape inference with their data (shapes, axes, ...)


class OnnxSemantics:
    """ONNX ops as the op records define them (see graph.passes.OpSemantics)."""

    @property
    def conv_regions(self) -> bool:
        """Whether the CPU path can run ConvRegion nodes: PyTorch with oneDNN (graph/passes/conv_regions.py)."""
        from .ops import conv

        if not conv.CPU_TORCH:
            return False
        import torch

        return bool(torch.backends.mkldnn.is_available())

    def evaluate(
        self, node: Node, args: list[np.ndarray | None], opset: int, max_elements: int
    ) -> list[np.ndarray] | None:
        """The node's outputs for these constant inputs; None when it cannot be computed now (run time will
        say why, naming the node) or its record estimates an output of more than `max_elements`."""
        record = OPS.get(node.op) if not node.domain else None
        if record is None:
            return None
        try:
            if record.size is not None and math.prod(record.size(node, args, opset)[0]) > max_elements:
                return None
            with np.errstate(all="ignore"):
                result = record.numpy(node, opset)(*args)
        except Exception:
            return None
        results = list(result) if isinstance(result, tuple | list) else [result]
        return [np.array(r) for r in results[: len(node.outputs)]]  # owned, writable copies

    def infer_types(self, graph: Graph) -> list[Value]:
        """The types ONNX shape inference (with data propagation) gives the values of the graph's nodes;
        best effort: [] when it cannot run on this graph."""
        try:
            model = to_onnx(graph, with_values=False, typed_only_above=SHAPE_DATA_ELEMENTS)
            inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
        except Exception:
            return []
        return [value_of(info) for info in (*inferred.graph.value_info, *inferred.graph.output)]


ONNX_SEMANTICS = OnnxSemantics()
