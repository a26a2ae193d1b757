"""`onnx.backend.base.Backend` adapter, so the ONNX backend test suite can drive InferenceSession."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from .dtypes import SUPPORTED_DTYPES
from .ops import SUPPORTED
from .options import GraphOptimizationLevel, SessionOptions
from .session import InferenceSession


class XrtRep(BackendRep):
    """A prepared model: runs inputs given in graph-input order."""

    def __init__(self, session: InferenceSession) -> None:
        self.session = session

    def run(self, inputs: Any, **kwargs: Any) -> tuple:
        names = [i.name for i in self.session.get_inputs()]
        if isinstance(inputs, dict):
            feed = inputs
        else:
            arrays = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
            feed = dict(zip(names, arrays))
        return tuple(self.session.run(None, feed))


class XrtBackend(Backend):
    """Runs ONNX models on the CPU with InferenceSession at a chosen optimization level."""

    level: GraphOptimizationLevel = GraphOptimizationLevel.ORT_ENABLE_ALL

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> XrtRep:
        level = kwargs.pop("level", cls.level)
        options = SessionOptions(graph_optimization_level=level)
        return XrtRep(InferenceSession(model, options, device="cpu" if device.upper() == "CPU" else "cuda"))

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper() in ("CPU", "CUDA")


def _ops_claimed(graph: onnx.GraphProto) -> bool:
    """Whether every node of the graph, and of its subgraphs, is of an op the session runs."""
    for node in graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type not in SUPPORTED:
            return False
        for attr in node.attribute:
            subgraphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            if not all(_ops_claimed(sub) for sub in subgraphs):
                return False
    return True


def claims(model: onnx.ModelProto) -> bool:
    """Whether every op (subgraphs included) and tensor type of `model` is one the session claims."""
    if not _ops_claimed(model.graph):
        return False
    for v in (*model.graph.input, *model.graph.output):
        if not v.type.HasField("tensor_type"):
            return False
        try:
            dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)).name
        except Exception:
            return False
        if dtype not in SUPPORTED_DTYPES:
            return False
    return True
