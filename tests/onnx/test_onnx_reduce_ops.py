"""InferenceSession on reductions and scans: TopK (1, 10, 11) with ties, fed k and k = 0, Reduce axes fed as an
input, CumSum over an empty axis; on the CPU and through the GPU path's PyTorch functions (CPU tensors)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx_models import (
    LEVELS,
    PROPERTY,
    RNG,
    check_reference,
    make,
    onnxruntime,
    ours,
    randn,
    run_on,
    same,
    session_at,
    torch_run,
    vi,
)
from strategies import seeds

from xpuruntime.onnx import InferenceSession, NodeExecutionError, SessionOptions

F, D, H, I32, I64 = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT32, TensorProto.INT64


# -- TopK -----------------------------------------------------------------------------------------------------
def topk_model(k: int, *, axis: int = -1, largest: int | None = None, opset: int = 11, shape: list | None = None,
               dtype: int = F, fed_k: bool = False) -> onnx.ModelProto:  # fmt: skip
    shape = shape or [3, 4, 9]
    attrs = {"axis": axis, **({} if largest is None else {"largest": largest})}
    if opset < 10:
        node = helper.make_node("TopK", ["x"], ["v", "i"], k=k, **attrs)
        return make([node], [vi("x", shape, dtype)], [vi("v", None, dtype), vi("i", None, I64)], opset=opset)
    inputs = [vi("x", shape, dtype)] + ([vi("k", [1], I64)] if fed_k else [])
    consts = {} if fed_k else {"k": np.array([k], np.int64)}
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], **attrs)
    return make([node], inputs, [vi("v", None, dtype), vi("i", None, I64)], consts, opset)


def ties(rng: np.random.Generator, *shape: int, dtype: type = np.float32) -> np.ndarray:
    """Values from a small set: many ties (never zero)."""
    return (rng.integers(1, 5, shape) * np.where(rng.random(shape) > 0.5, 1, -1)).astype(dtype)


@pytest.mark.parametrize("opset", [1, 9, 10, 11, 24])
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_topk_matches_onnxruntime_with_ties(opset: int, axis: int, rng) -> None:
    """TopK-1 (k an attribute), TopK-10 (an input) and TopK-11 (largest): ties come lower index first."""
    for data in (ties(rng, 3, 4, 9), randn(rng, 3, 4, 9)):
        for k in (1, 3, data.shape[axis]):
            for largest in (None,) if opset < 11 else (1, 0):
                model = topk_model(k, axis=axis, largest=largest, opset=opset)
                same(ours(model, {"x": data}), onnxruntime(model, {"x": data}), atol=0, rtol=0)


@pytest.mark.parametrize("level", LEVELS)
def test_topk_dtypes_fed_k_and_k_zero(level: str, rng) -> None:
    for dtype, np_type in ((I64, np.int64), (D, np.float64), (I32, np.int32)):
        data = {"x": ties(rng, 5, 7, dtype=np_type)}
        model = topk_model(4, axis=1, shape=[5, 7], dtype=dtype)
        same(ours(model, data, level), onnxruntime(model, data), atol=0, rtol=0)
    model = topk_model(1, fed_k=True, largest=0)
    sess = InferenceSession(model.SerializeToString(), SessionOptions(graph_optimization_level=level))
    x = ties(rng, 3, 4, 9)
    for k in (2, 9, 5):
        feed = {"x": x, "k": np.array([k], np.int64)}
        same(sess.run(None, feed), onnxruntime(model, feed), atol=0, rtol=0)
    values, index = ours(topk_model(0), {"x": x}, level)
    assert values.shape == index.shape == (3, 4, 0) and values.dtype == np.float32 and index.dtype == np.int64
    with pytest.raises(NodeExecutionError, match="TopK: k=\\[10\\]"):
        ours(topk_model(10), {"x": x}, level)


def _topk_reference(x: np.ndarray, k: int, axis: int, largest: bool) -> tuple[np.ndarray, np.ndarray]:
    """Sort every lane by (value, index), the value descending for largest: the independent reference."""
    moved = np.moveaxis(x, axis, -1)
    lanes = moved.reshape(-1, moved.shape[-1])
    keys = [sorted(range(len(lane)), key=lambda i, lane=lane: (-lane[i] if largest else lane[i], i))[:k]
            for lane in lanes]  # fmt: skip
    index = np.array(keys, np.int64).reshape(*moved.shape[:-1], k)
    values = np.take_along_axis(moved, index, axis=-1)
    return np.moveaxis(values, -1, axis), np.moveaxis(index, -1, axis)


@given(
    seed=seeds,
    shape=st.lists(st.integers(1, 7), min_size=1, max_size=3),
    largest=st.booleans(),
    data=st.data(),
)
@PROPERTY
def test_topk_property_matches_a_sort_reference(seed, shape, largest, data) -> None:
    rng = np.random.default_rng(seed)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    k = data.draw(st.integers(0, shape[axis]))
    x = ties(rng, *shape) if data.draw(st.booleans()) else randn(rng, *shape)
    model = topk_model(k, axis=axis, largest=int(largest), shape=list(shape))
    same(ours(model, {"x": x}), list(_topk_reference(x, k, axis, largest)), atol=0, rtol=0)


def test_topk_through_the_torch_path(torch_session, rng) -> None:
    x = ties(rng, 3, 4, 9)
    for axis in (-1, 0, 1):
        for largest in (1, 0):
            model = topk_model(3, axis=axis, largest=largest)
            same(torch_run(torch_session, model, {"x": x}), onnxruntime(model, {"x": x}), atol=0, rtol=0)


# -- TopK on the PyTorch path: axis and k are not checked -----------------------------------------------------------
def _topk_model(k: list, axis: int) -> onnx.ModelProto:
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=axis)
    return make([node], [vi("x", [3, 4, 9])], [vi("v", None), vi("i", None, I64)], {"k": np.array(k, np.int64)}, 11)


@pytest.mark.parametrize(("k", "axis"), [([2], 3), ([2], -4), ([12], -1), ([-1], -1), ([2, 3], -1)])
def test_topk_torch_path_refuses_what_the_numpy_path_refuses(k: list, axis: int, torch_session, rng) -> None:
    """An axis out of range wraps around on the PyTorch path (axis % rank) and returns a result; k > dim or
    k < 0 surface as PyTorch's narrow() errors; a k of two values silently uses the first. The NumPy path
    refuses each with a TopK error naming k or the axis: the GPU path must too."""
    model, feed = _topk_model(k, axis), {"x": randn(rng, 3, 4, 9)}
    with pytest.raises(NodeExecutionError) as cpu:
        ours(model, feed)
    expected = str(cpu.value).split("): ", 1)[1]  # e.g. "ShapeError: TopK: axis 3 is out of range for a 3-d input"
    with pytest.raises(NodeExecutionError) as gpu:
        run_on("torch", torch_session, model, feed)
    assert expected in str(gpu.value)


@pytest.mark.parametrize("level", LEVELS)
def test_reduce_axes_fed_as_an_input(level: str) -> None:
    """ReduceSum over axes given by an input: a square input keeps the output shape, not the axis."""
    nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)]
    model = make(nodes, [vi("x", [5, 5]), vi("axes", [1], I64)], [vi("y", None)])
    sess, x = session_at(model, level), randn(RNG, 5, 5)
    for axis in (0, 1, -1, 0):
        check_reference(sess, model, {"x": x, "axes": np.array([axis])})


@pytest.mark.parametrize("level", LEVELS)
def test_exclusive_cumsum_over_an_empty_axis(level: str) -> None:
    nodes = [helper.make_node("CumSum", ["x", "axis"], ["y"], exclusive=1, reverse=1)]
    model = make(nodes, [vi("x", [3, "n"])], [vi("y", None)], {"axis": np.array(1)})
    sess = session_at(model, level)
    check_reference(sess, model, {"x": randn(RNG, 3, 0)})
    check_reference(sess, model, {"x": randn(RNG, 3, 4)})


# -- CumProd, Hardmax, Det ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["numpy", "torch"])
def test_cumprod_hardmax_and_det_match_onnxruntime(path: str, torch_session, rng) -> None:
    x = (rng.uniform(0.5, 1.5, (3, 4, 4)) * np.where(rng.random((3, 4, 4)) < 0.3, -1, 1)).astype(np.float32)
    x[1, 2] = x[1, 2].max()  # ties: Hardmax picks the first
    nodes = [helper.make_node("CumProd", ["x", "axis"], [f"c{e}{r}"], exclusive=e, reverse=r)
             for e in (0, 1) for r in (0, 1)]  # fmt: skip
    nodes += [helper.make_node("Hardmax", ["x"], ["h"], axis=1), helper.make_node("Det", ["x"], ["d"])]
    outs = [vi(n.output[0], None) for n in nodes]
    model = make(nodes, [vi("x", [3, 4, 4])], outs, {"axis": np.array(-1, np.int64)}, opset=26)
    same(run_on(path, torch_session, model, {"x": x}), onnxruntime(model, {"x": x}), atol=1e-5)
    old = make([helper.make_node("Hardmax", ["x"], ["h"], axis=1)], [vi("x", [3, 4, 4])], [vi("h", None)], opset=11)
    same(run_on(path, torch_session, old, {"x": x}), onnxruntime(old, {"x": x}), atol=0, rtol=0)  # 2-D coercion
