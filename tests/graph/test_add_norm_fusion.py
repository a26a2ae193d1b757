"""Residual add + norm fusion (graph/passes/add_norm_fusion): on graphs made for the GPU, Add + LayerNormalization
and Add + RMSNorm become one add_layer_norm / add_rms_norm node with outputs (y, h), run as one kernel step that
also writes h; results match onnxruntime through kernels, through the GPU path's PyTorch fallback and through the
float64 reference; broadcasting adds and CPU graphs stay as they were."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

pytest.importorskip("onnxruntime")

from onnx_models import (
    cpu_kernels_on_tensors,
    make,
    onnxruntime,
    optimize_as_cuda,
    randn,
    same,
    torch_path_builder,
    vi,
)

from xpuruntime.dispatch import Dispatcher
from xpuruntime.graph.passes import optimize
from xpuruntime.onnx import InferenceSession
from xpuruntime.onnx.executor import run_graph
from xpuruntime.onnx.importer import import_model
from xpuruntime.onnx.semantics import ONNX_SEMANTICS
from xpuruntime.registry import Registry, default_registry

WIDTH = 16


def _block(rng, residual_dims: list) -> onnx.ModelProto:
    """A pre-norm block as exporters write it: h1 = x + r, LayerNorm, a projection, h2 = p + h1 (a graph output
    too), LayerNorm, then h3 = y2 + h2 and an RMSNorm decomposition of it (HF Llama's: x * 1/sqrt(mean(x^2) + eps)
    * w). r's dims have their own names (shape inference names the same sizes apart after each Add)."""
    nodes = [
        helper.make_node("Add", ["x", "r"], ["h1"]),
        helper.make_node("LayerNormalization", ["h1", "g1", "b1"], ["y1"], axis=-1, epsilon=1e-5),
        helper.make_node("MatMul", ["y1", "w"], ["p"]),
        helper.make_node("Add", ["p", "h1"], ["h2"]),
        helper.make_node("LayerNormalization", ["h2", "g2", "b2"], ["y2"], axis=-1, epsilon=1e-3),
        helper.make_node("Add", ["y2", "h2"], ["h3"]),
        helper.make_node("Pow", ["h3", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1]),
        helper.make_node("Add", ["ms", "eps"], ["mse"]),
        helper.make_node("Sqrt", ["mse"], ["rms"]),
        helper.make_node("Reciprocal", ["rms"], ["inv"]),
        helper.make_node("Mul", ["h3", "inv"], ["normed"]),
        helper.make_node("Mul", ["normed", "gr"], ["z"]),
    ]
    consts = {
        "g1": randn(rng, WIDTH), "b1": randn(rng, WIDTH), "g2": randn(rng, WIDTH), "b2": randn(rng, WIDTH),
        "w": randn(rng, WIDTH, WIDTH) / 4, "gr": randn(rng, WIDTH), "two": np.float32(2.0),
        "eps": np.float32(1e-6),
    }  # fmt: skip
    inputs = [vi("x", ["n", "s", WIDTH]), vi("r", residual_dims)]
    return make(nodes, inputs, [vi("z", None), vi("h2", None)], consts, 17)


@pytest.fixture
def cuda_passes(monkeypatch):
    """Sessions optimize their graphs as for a CUDA device (the fusion is made for GPU graphs)."""
    optimize_as_cuda(monkeypatch)


def _feed(rng, batch: int, residual_batch: int | None = None) -> dict:
    return {"x": randn(rng, batch, 5, WIDTH), "r": randn(rng, residual_batch or batch, 5, WIDTH)}


def _fused_ops(session: InferenceSession) -> dict[str, int]:
    counts = session.graph.op_counts()
    return {op: counts.get(op, 0) for op in ("add_layer_norm", "add_rms_norm", "LayerNormalization", "Add")}


def test_adds_and_norms_become_one_node_each_on_gpu_graphs(rng, cuda_passes) -> None:
    """Every residual add with its norm fused, h2 still a graph output (the fused node's second output); through
    kernel steps (the CPU kernels on tensors, as the GPU's Triton kernels run) the outputs match onnxruntime at
    two batch sizes, h written by the kernel."""
    pytest.importorskip("torch")
    from xpuruntime.onnx.runners import gpu_runner_factory

    model = _block(rng, ["m", "t", WIDTH])
    registry = cpu_kernels_on_tensors("add_layer_norm/numpy", "add_rms_norm/numpy", "rms_norm/numpy")
    session = InferenceSession(model.SerializeToString(), runner=gpu_runner_factory("cpu"),
                               dispatcher=Dispatcher(registry))  # fmt: skip
    assert _fused_ops(session) == {"add_layer_norm": 2, "add_rms_norm": 1, "LayerNormalization": 0, "Add": 0}
    for batch in (2, 3):
        feed = _feed(rng, batch)
        same(session.run(None, feed), onnxruntime(model, feed), atol=1e-4, rtol=1e-4)
        kinds = {s.node.op: s.kind for s in session.runner.last_plan().steps}
        assert kinds["add_layer_norm"] == kinds["add_rms_norm"] == "kernel", kinds


def test_a_residual_that_broadcasts_at_run_time_falls_back(rng, cuda_passes) -> None:
    """r's symbolic batch is 1 at run time: the op refuses a residual of another shape, so that signature's plan
    adds by broadcasting in PyTorch; the other signature still runs the fused kernels. Both match onnxruntime."""
    pytest.importorskip("torch")
    from xpuruntime.onnx.runners import gpu_runner_factory

    model = _block(rng, ["m", "t", WIDTH])
    registry = cpu_kernels_on_tensors("add_layer_norm/numpy", "add_rms_norm/numpy")
    session = InferenceSession(model.SerializeToString(), runner=gpu_runner_factory("cpu"),
                               dispatcher=Dispatcher(registry))  # fmt: skip
    for feed, kind in ((_feed(rng, 3, residual_batch=1), "torch"), (_feed(rng, 2), "kernel")):
        same(session.run(None, feed), onnxruntime(model, feed), atol=1e-4, rtol=1e-4)
        first = next(s for s in session.runner.last_plan().steps if s.node.op == "add_layer_norm")
        assert first.kind == kind, first.describe()


def test_pytorch_fallback_and_reference_give_both_outputs(rng, cuda_passes) -> None:
    """No kernel at all: the GPU path's PyTorch fallback, and the NumPy path's float64 reference (which writes h
    into the buffer it is given), each give y and h."""
    pytest.importorskip("torch")
    model = _block(rng, ["m", "t", WIDTH])
    feed = _feed(rng, 2)
    want = onnxruntime(model, feed)
    session = torch_path_builder()(model)
    assert _fused_ops(session)["add_layer_norm"] == 2
    same(session.run(None, feed), want, atol=1e-4, rtol=1e-4)
    graph, _ = optimize(import_model(model), 99, device="cuda", semantics=ONNX_SEMANTICS)
    schemas_only = Registry()
    for schema in default_registry().ops.values():
        schemas_only.register_op(schema)
    same(run_graph(graph, feed, Dispatcher(schemas_only)), want, atol=1e-4, rtol=1e-4)


def test_broadcasting_adds_and_cpu_graphs_are_left_alone(rng, cuda_passes) -> None:
    """A residual with a literal 1 facing another dim (a position embedding over a batch) is a broadcast: not
    fused. A CPU session's graph is not fused at all (its add-norm kernel makes the same two passes)."""
    model = _block(rng, [1, "t", WIDTH])
    counts = _fused_ops(torch_path_builder()(model))
    assert counts["add_layer_norm"] == 1 and counts["LayerNormalization"] == 1, counts  # h1 = x + r stays
    feed = _feed(rng, 2, residual_batch=1)
    same(torch_path_builder()(model).run(None, feed), onnxruntime(model, feed), atol=1e-4, rtol=1e-4)
    graph, records = optimize(import_model(_block(rng, ["m", "t", WIDTH])), 99, device="cpu", semantics=ONNX_SEMANTICS)
    assert "add_layer_norm" not in graph.op_counts()
    assert next(r.changes for r in records if r.name == "add_norm_fusion") == 0
