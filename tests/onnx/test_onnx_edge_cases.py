"""InferenceSession on valid but unusual models, checked against onnx's ReferenceEvaluator: shapes set by
input values, old opsets, results the caller may change, empty axes, casts inside fused chains."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from xpuruntime.onnx import InferenceSession, SessionOptions

F, H, I64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64
LEVELS = ("disabled", "basic", "all")
rng = np.random.default_rng(20)


def make(nodes: list, inputs: list, outputs: list, consts: dict | None = None, opset: int = 17) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in (consts or {}).items()]
    graph = helper.make_graph(nodes, "t", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def vi(name: str, shape: list | None, dtype: int = F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def randn(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def session(model: onnx.ModelProto, level: str) -> InferenceSession:
    return InferenceSession(model.SerializeToString(), SessionOptions(graph_optimization_level=level))


def check(sess: InferenceSession, model: onnx.ModelProto, feed: dict, rtol: float = 1e-5) -> None:
    want = ReferenceEvaluator(model).run(None, feed)
    got = sess.run(None, {k: v.copy() for k, v in feed.items()})
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, f"got {g.dtype}{g.shape}, expected {w.dtype}{w.shape}"
        np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-6)


@pytest.mark.parametrize("level", LEVELS)
def test_shapes_set_by_input_values_change_between_runs(level: str) -> None:
    """Same input signature, different values of `n`: the sliced rows, and every shape after them
    (a MatMul, a Softmax, Shape -> ConstantOfShape), differ from run to run."""
    nodes = [
        helper.make_node("Slice", ["x", "zero", "n", "zero"], ["rows"]),
        helper.make_node("MatMul", ["rows", "w"], ["h"]),
        helper.make_node("Softmax", ["h"], ["p"]),
        helper.make_node("Shape", ["p"], ["s"]),
        helper.make_node("ConstantOfShape", ["s"], ["ones"], value=numpy_helper.from_array(np.ones(1, np.float32))),
        helper.make_node("Add", ["p", "ones"], ["y"]),
    ]
    consts = {"w": randn(5, 3), "zero": np.array([0])}
    model = make(nodes, [vi("x", [7, 5]), vi("n", [1], I64)], [vi("y", None), vi("s", None)], consts)
    sess, x = session(model, level), randn(7, 5)
    for n in (2, 5, 7, 2):
        check(sess, model, {"x": x, "n": np.array([n])})


@pytest.mark.parametrize("level", LEVELS)
def test_reduce_axes_fed_as_an_input(level: str) -> None:
    """ReduceSum over axes given by an input: a square input keeps the output shape, not the axis."""
    nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)]
    model = make(nodes, [vi("x", [5, 5]), vi("axes", [1], I64)], [vi("y", None)])
    sess, x = session(model, level), randn(5, 5)
    for axis in (0, 1, -1, 0):
        check(sess, model, {"x": x, "axes": np.array([axis])})


@pytest.mark.parametrize("level", LEVELS)
def test_slice_before_opset_10_takes_attributes(level: str) -> None:
    nodes = [helper.make_node("Slice", ["x"], ["y"], starts=[1, -4], ends=[100, -1], axes=[0, -1])]
    model = make(nodes, [vi("x", [4, 6])], [vi("y", None)], opset=9)
    check(session(model, level), model, {"x": randn(4, 6)})


@pytest.mark.parametrize("level", LEVELS)
def test_results_belong_to_the_caller(level: str) -> None:
    """Changing the returned arrays changes neither the inputs nor later runs: outputs that are constants,
    shapes or the input itself are copies."""
    nodes = [
        helper.make_node("Add", ["c1", "c2"], ["k"]),  # all constants: folded
        helper.make_node("Mul", ["x", "k"], ["y"]),
        helper.make_node("Shape", ["x"], ["s"]),  # a constant of the plan
        helper.make_node("Identity", ["x"], ["same"]),
    ]
    outputs = [vi("y", None), vi("k", None), vi("s", None), vi("same", None), vi("x", [3, 4])]
    model = make(nodes, [vi("x", [3, 4])], outputs, {"c1": randn(4), "c2": randn(4)})
    sess, x = session(model, level), randn(3, 4)
    x_copy = x.copy()
    first = sess.run(None, {"x": x})
    for result in first:
        assert not np.shares_memory(result, x)
        result[...] = 0
    np.testing.assert_array_equal(x, x_copy)
    check(sess, model, {"x": x})


@pytest.mark.parametrize("level", LEVELS)
def test_exclusive_cumsum_over_an_empty_axis(level: str) -> None:
    nodes = [helper.make_node("CumSum", ["x", "axis"], ["y"], exclusive=1, reverse=1)]
    model = make(nodes, [vi("x", [3, "n"])], [vi("y", None)], {"axis": np.array(1)})
    sess = session(model, level)
    check(sess, model, {"x": randn(3, 0)})
    check(sess, model, {"x": randn(3, 4)})


def test_fused_chain_keeps_the_rounding_of_a_cast_to_float16() -> None:
    """Cast(float32 -> float16) rounds before the float16 math that follows, fused or not."""
    nodes = [
        helper.make_node("Cast", ["x"], ["h"], to=H),
        helper.make_node("Sub", ["h", "one"], ["d"]),
        helper.make_node("Mul", ["d", "k"], ["y"]),
    ]
    consts = {"one": np.float16(1), "k": np.float16(3)}
    model = make(nodes, [vi("x", [4, 9])], [vi("y", [4, 9], H)], consts)
    x = (1 + rng.random((4, 9)) * 2e-3).astype(np.float32)  # between float16 steps near 1
    for level in LEVELS:
        check(session(model, level), model, {"x": x}, rtol=1e-3)


def test_gpu_planner_recomputes_value_set_shapes() -> None:
    """The GPU path (run here with CPU tensors): a Shape of a value-set shape runs each time too."""
    pytest.importorskip("torch")
    from xpuruntime.onnx.gpu import GpuRunner

    nodes = [
        helper.make_node("Slice", ["x"], ["rows"], starts=[0], ends=[3], axes=[1]),
        helper.make_node("Reshape", ["rows", "target"], ["r"]),
        helper.make_node("Shape", ["r"], ["s"]),
        helper.make_node("ConstantOfShape", ["s"], ["ones"], value=numpy_helper.from_array(np.ones(1, np.float32))),
        helper.make_node("Sub", ["r", "ones"], ["y"]),
    ]
    model = make(nodes, [vi("x", [6, 4]), vi("target", [2], I64)], [vi("y", None), vi("s", None)], opset=9)
    sess = InferenceSession(model.SerializeToString(), SessionOptions(enable_cuda_graph=False))
    sess._backend = GpuRunner(sess, torch_device="cpu")
    x = randn(6, 4)
    for target in ([9, 2], [2, 9], [-1, 6], [9, 2]):
        check(sess, model, {"x": x, "target": np.array(target)})


def test_a_strict_policy_whose_kernel_cannot_run_a_node_raises():
    """strict=True means the policy's kernel or an error: never the op map's function in its place."""
    from xpuruntime.errors import UnsupportedByPolicyError

    model = make([helper.make_node("MatMul", ["a", "b"], ["y"])], [vi("a", [5, 7]), vi("b", [7, 3])], [vi("y", None)])
    feed = {"a": randn(5, 7), "b": randn(7, 3)}
    relaxed = InferenceSession(model.SerializeToString(), policy="matmul=gemv")  # falls back, as it should
    check(relaxed, model, feed)
    strict = InferenceSession(model.SerializeToString(), policy="matmul=gemv,strict=true")
    with pytest.raises(UnsupportedByPolicyError, match="gemv"):
        strict.run(None, feed)
