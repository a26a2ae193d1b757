"""Feeding initializers, as onnxruntime does it: from ONNX IR version 4, an initializer that is also listed
among the graph's inputs is a default value a feed may replace ("overridable"); every other initializer is
a constant, and a feed for it is refused naming it. A fed value is used in every run that feeds it, and
never leaks into a run that does not (plans, folded constants and fused weights made from the default are
not reused for it)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from xpuruntime.errors import DTypeError, ShapeError
from xpuruntime.onnx import InferenceSession, InputFeedError, SessionOptions

F, I64 = TensorProto.FLOAT, TensorProto.INT64
LEVELS = ("disabled", "basic", "all")


def make(
    nodes: list, inputs: list, outputs: list, consts: dict, ir_version: int = 8, opset: int = 17
) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()]
    graph = helper.make_graph(nodes, "t", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version)


def vi(name: str, shape: list | None, dtype: int = F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def ort_session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3  # the "initializer appears in graph inputs" warning is the point here
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def session(model: onnx.ModelProto, level: str = "all") -> InferenceSession:
    return InferenceSession(model.SerializeToString(), SessionOptions(graph_optimization_level=level))


def same(got: list, want: list, rtol: float = 1e-5) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, f"got {g.dtype}{g.shape}, expected {w.dtype}{w.shape}"
        np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-5)


def linear_model(rng: np.random.Generator) -> tuple[onnx.ModelProto, dict]:
    """MatMul + Add + Relu (linear fusion and packing at level all), a weight scaled by a constant (folded),
    and a bias: w and bias are listed among the inputs (overridable), `two` is not."""
    consts = {
        "w": rng.standard_normal((8, 6)).astype(np.float32),
        "bias": rng.standard_normal(6).astype(np.float32),
        "two": np.array(2.0, np.float32),
    }
    nodes = [
        helper.make_node("Mul", ["w", "two"], ["w2"]),
        helper.make_node("MatMul", ["x", "w2"], ["h"]),
        helper.make_node("Add", ["h", "bias"], ["hb"]),
        helper.make_node("Relu", ["hb"], ["y"]),
    ]
    inputs = [vi("x", ["batch", 8]), vi("w", [8, 6]), vi("bias", [6])]
    return make(nodes, inputs, [vi("y", ["batch", 6])], consts), consts


@pytest.mark.parametrize("level", LEVELS)
def test_a_listed_initializer_takes_the_fed_value_in_every_run_that_feeds_it(level: str, rng) -> None:
    model, consts = linear_model(rng)
    ours, theirs = session(model, level), ort_session(model)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    w1, w2 = (rng.standard_normal((8, 6)).astype(np.float32) for _ in range(2))
    b1 = rng.standard_normal(6).astype(np.float32)
    feeds = [
        {"x": x},  # the default: folded and fused into constants
        {"x": x, "w": w1},
        {"x": x, "w": w2},  # same signature, another value
        {"x": x},  # the default again after fed runs
        {"x": x, "w": w1, "bias": b1},
        {"x": x, "bias": b1},
        {"x": x, "w": w2},
        {"x": x},
    ]
    for feed in feeds:
        same(ours.run(None, feed), theirs.run(None, feed))
    same(ours.run(None, {"x": x, "w": consts["w"], "bias": consts["bias"]}), ours.run(None, {"x": x}))


def test_the_session_lists_overridable_initializers_as_onnxruntime_does(rng) -> None:
    model, _ = linear_model(rng)
    ours, theirs = session(model), ort_session(model)
    assert [(i.name, i.shape, i.type) for i in ours.get_inputs()] == [
        (i.name, i.shape, i.type) for i in theirs.get_inputs()
    ]
    assert (
        [(i.name, i.shape, i.type) for i in ours.get_overridable_initializers()]
        == [(i.name, i.shape, i.type) for i in theirs.get_overridable_initializers()]
        == [("w", [8, 6], "tensor(float)"), ("bias", [6], "tensor(float)")]
    )


@pytest.mark.parametrize("level", LEVELS)
def test_a_fed_shape_initializer_reshapes_every_run(level: str, rng) -> None:
    """A Reshape target that is an overridable initializer: the default is folded into the plan as a
    constant shape; fed values must reshape each run, and the default must come back without the feed."""
    nodes = [helper.make_node("Reshape", ["x", "target"], ["r"]), helper.make_node("Softmax", ["r"], ["y"], axis=-1)]
    consts = {"target": np.array([4, 6], np.int64)}
    model = make(nodes, [vi("x", [2, 12]), vi("target", [2], I64)], [vi("y", None)], consts)
    ours, theirs = session(model, level), ort_session(model)
    x = rng.standard_normal((2, 12)).astype(np.float32)
    for target in (None, [3, 8], [8, 3], None, [-1, 2], [3, 8]):
        feed = {"x": x} if target is None else {"x": x, "target": np.array(target, np.int64)}
        same(ours.run(None, feed), theirs.run(None, feed))


@pytest.mark.parametrize("level", LEVELS)
def test_an_initializer_declared_with_a_symbolic_shape_takes_other_shapes(level: str, rng) -> None:
    nodes = [helper.make_node("Mul", ["x", "scale"], ["s"]), helper.make_node("ReduceSum", ["s"], ["y"], keepdims=0)]
    model = make(
        nodes, [vi("x", [4, 1]), vi("scale", ["n"])], [vi("y", None)], {"scale": np.arange(3, dtype=np.float32)}
    )
    ours, theirs = session(model, level), ort_session(model)
    x = rng.standard_normal((4, 1)).astype(np.float32)
    for n in (None, 5, 1, None, 5):
        feed = {"x": x} if n is None else {"x": x, "scale": rng.standard_normal(n).astype(np.float32)}
        same(ours.run(None, feed), theirs.run(None, feed))


def test_a_fed_initializer_must_match_its_declared_type(rng) -> None:
    model, _ = linear_model(rng)
    ours, x = session(model), rng.standard_normal((3, 8)).astype(np.float32)
    with pytest.raises(ShapeError, match="'w'"):
        ours.run(None, {"x": x, "w": np.zeros((8, 5), np.float32)})
    with pytest.raises(DTypeError, match="'w'"):
        ours.run(None, {"x": x, "w": np.zeros((8, 6), np.float64)})
    with pytest.raises(InputFeedError, match=r"missing input\(s\) \['x'\]"):
        ours.run(None, {"w": np.zeros((8, 6), np.float32)})


@pytest.mark.parametrize("listed, ir_version", [(False, 8), (False, 4), (True, 3)])
def test_a_constant_initializer_is_refused_by_name_as_onnxruntime_refuses_it(
    listed: bool, ir_version: int, rng
) -> None:
    """Not listed among the inputs, or listed in a model of IR version 3 (where initializers are constants):
    onnxruntime says 'Invalid input name'; the session says which initializer and why."""
    nodes = [helper.make_node("Add", ["x", "bias"], ["y"])]
    inputs = [vi("x", [2, 3]), *([vi("bias", [3])] if listed else [])]
    model = make(nodes, inputs, [vi("y", None)], {"bias": np.ones(3, np.float32)}, ir_version, opset=9)
    ours, theirs = session(model), ort_session(model)
    feed = {"x": rng.standard_normal((2, 3)).astype(np.float32), "bias": np.zeros(3, np.float32)}
    with pytest.raises(Exception, match="Invalid input name: bias"):
        theirs.run(None, feed)
    reason = "IR version 3" if listed else "not listed among the graph's inputs"
    with pytest.raises(InputFeedError, match=rf"'bias' is an initializer.*{reason}"):
        ours.run(None, feed)
    assert ours.get_overridable_initializers() == theirs.get_overridable_initializers() == []
    same(ours.run(None, {"x": feed["x"]}), theirs.run(None, {"x": feed["x"]}))


@pytest.mark.parametrize("level", LEVELS)
def test_gpu_path_uses_fed_initializers_too(level: str, rng) -> None:
    """The GPU runner (here with CPU tensors, so no kernels: a scale folded with a constant, a bias, a
    Reshape target): NumPy and tensor feeds of initializers, and runs without them in between."""
    torch = pytest.importorskip("torch")
    from xpuruntime.onnx.runners import gpu_runner_factory

    consts = {
        "scale": rng.standard_normal(6).astype(np.float32),
        "two": np.array(2.0, np.float32),
        "bias": rng.standard_normal(6).astype(np.float32),
        "target": np.array([2, 9], np.int64),
    }
    nodes = [
        helper.make_node("Mul", ["scale", "two"], ["scale2"]),
        helper.make_node("Mul", ["x", "scale2"], ["xs"]),
        helper.make_node("Add", ["xs", "bias"], ["xb"]),
        helper.make_node("Reshape", ["xb", "target"], ["y"]),
    ]
    inputs = [vi("x", [3, 6]), vi("scale", [6]), vi("bias", [6]), vi("target", [2], I64)]
    model = make(nodes, inputs, [vi("y", None)], consts)
    options = SessionOptions(graph_optimization_level=level, enable_cuda_graph=False)
    ours = InferenceSession(model.SerializeToString(), options, runner=gpu_runner_factory("cpu"))
    theirs = ort_session(model)
    x = rng.standard_normal((3, 6)).astype(np.float32)
    s1, s2 = (rng.standard_normal(6).astype(np.float32) for _ in range(2))
    feeds = [
        {"x": x},
        {"x": x, "scale": s1},
        {"x": x, "scale": s2},
        {"x": x},
        {"x": x, "scale": s1, "target": np.array([6, 3], np.int64)},
        {"x": x, "scale": s2, "target": np.array([9, 2], np.int64)},
        {"x": x, "bias": s1},
        {"x": x},
    ]
    for feed in feeds:
        want = theirs.run(None, feed)
        same(ours.run(None, feed), want)
        (got,) = ours.run(None, {k: torch.from_numpy(v) for k, v in feed.items()})
        np.testing.assert_allclose(got.numpy(), want[0], rtol=1e-5, atol=1e-5)
    with pytest.raises(InputFeedError, match="'two' is an initializer"):
        ours.run(None, {"x": torch.from_numpy(x), "two": torch.ones(())})
