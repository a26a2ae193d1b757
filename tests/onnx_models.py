"""Small ONNX models built by hand for the InferenceSession tests, and how they are run: by us and by
onnxruntime (CPU)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from xpuruntime.onnx import InferenceSession, SessionOptions


def make(
    nodes: list, inputs: list, outputs: list, consts: dict | None = None, opset: int = 13, ir_version: int | None = None
) -> onnx.ModelProto:
    """A one-graph model; IR version 3 before opset 7 (what those opsets came with), else 8."""
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in (consts or {}).items()]
    graph = helper.make_graph(nodes, "t", inputs, outputs, inits)
    ir = ir_version if ir_version is not None else 3 if opset < 7 else 8
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir)


def vi(name: str, shape: list | None, dtype: int = onnx.TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def ours(model: onnx.ModelProto, feed: dict, level: str = "all") -> list[np.ndarray]:
    """Our session's outputs (fed copies: a run must not write into the caller's arrays)."""
    sess = InferenceSession(model.SerializeToString(), SessionOptions(graph_optimization_level=level))
    return sess.run(None, {k: v.copy() for k, v in feed.items()})


def onnxruntime(model: onnx.ModelProto, feed: dict) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.log_severity_level = 3  # e.g. "only guarantees support for opset 7 or above": expected for old opsets
    sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return sess.run(None, feed)


def torch_path_builder():
    """build(model, level="all") -> a session whose runs go through the GPU path's PyTorch op map with CPU
    tensors (the GPU planner, no kernels of ours): the GPU path's semantics, testable without a GPU."""
    from xpuruntime.dispatch import Dispatcher
    from xpuruntime.onnx.gpu import GpuRunner
    from xpuruntime.registry import Registry, default_registry

    registry = Registry()
    for schema in default_registry().ops.values():
        registry.register_op(schema)
    dispatcher = Dispatcher(registry)

    def build(model: onnx.ModelProto, level: str = "all") -> InferenceSession:
        options = SessionOptions(graph_optimization_level=level, enable_cuda_graph=False)
        session = InferenceSession(model.SerializeToString(), options, dispatcher=dispatcher)
        session._backend = GpuRunner(session, torch_device="cpu")
        return session

    return build
