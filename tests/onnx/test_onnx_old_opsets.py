"""InferenceSession on ops in their old-opset forms (attributes that later became inputs, string Cast
targets, optional Concat axis, legacy broadcasting with `axis`), checked against onnxruntime where it
runs the model (it runs opset 7 and later, and a few older kernels such as Reshape-1) and otherwise
against a NumPy reference."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_models
import pytest
from onnx import TensorProto, helper
from onnx_models import onnxruntime as run_ort
from onnx_models import ours as run
from onnx_models import vi

from xpuruntime.onnx import InferenceSession, UnsupportedModelError

F, D, I32, I64 = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT32, TensorProto.INT64
LEVELS = ("disabled", "basic", "all")


def make(nodes: list, inputs: list, outputs: list, consts: dict | None = None, opset: int = 1) -> onnx.ModelProto:
    return onnx_models.make(nodes, inputs, outputs, consts, opset, ir_version=3)


def same(got: list[np.ndarray], want: list[np.ndarray], rtol: float = 1e-6) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        w = np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape, f"got {g.dtype}{g.shape}, expected {w.dtype}{w.shape}"
        np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-6)


# -- Reshape-1: the target shape is an attribute -------------------------------------------------------
@pytest.mark.parametrize("opset", [1, 4])
@pytest.mark.parametrize("level", LEVELS)
def test_reshape_before_opset_5_takes_the_shape_attribute(level: str, opset: int, rng) -> None:
    chain = [
        helper.make_node("Reshape", ["x"], ["r"], shape=[0, -1]),  # 0 keeps the dim, -1 is inferred
        helper.make_node("Reshape", ["r"], ["b"], shape=[4, 3, 2]),
        helper.make_node("Reshape", ["b"], ["y"], shape=[-1]),  # a Reshape chain: the passes merge it
    ]
    model = make(chain, [vi("x", [2, 3, 4])], [vi("y", None), vi("r", None)], opset=opset)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    same(run(model, {"x": x}, level), run_ort(model, {"x": x}))
    same(run(model, {"x": x}, level), [x.reshape(-1), x.reshape(2, 12)])
    nodes = [chain[0], helper.make_node("Relu", ["r"], ["a"]), helper.make_node("Reshape", ["a"], ["y"], shape=[3, 8])]
    model = make(nodes, [vi("x", [2, 3, 4])], [vi("y", None)], opset=opset)
    same(run(model, {"x": x}, level), [np.maximum(x, 0).reshape(3, 8)])


# -- Concat-1: axis is optional and defaults to 1 -----------------------------------------------------
@pytest.mark.parametrize("opset", [1, 3])
@pytest.mark.parametrize("level", LEVELS)
def test_concat_before_opset_4_defaults_to_axis_1(level: str, opset: int, rng) -> None:
    nodes = [helper.make_node("Concat", ["a", "b"], ["y"]), helper.make_node("Concat", ["a", "a"], ["z"], axis=0)]
    model = make(nodes, [vi("a", [2, 3]), vi("b", [2, 5])], [vi("y", None), vi("z", None)], opset=opset)
    a, b = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal((2, 5)).astype(np.float32)
    same(run(model, {"a": a, "b": b}, level), [np.concatenate([a, b], 1), np.concatenate([a, a], 0)])


# -- Cast-1 (opset 1 to 5): the target type is a string ----------------------------------------------
@pytest.mark.parametrize("opset", [1, 5])
@pytest.mark.parametrize("level", LEVELS)
def test_cast_before_opset_6_takes_a_type_name(level: str, opset: int) -> None:
    x = np.array([[-2.7, -0.2, 0.0], [0.6, 1.5, 300.25]], np.float32)
    targets = {"DOUBLE": (D, np.float64), "INT32": (I32, np.int32), "FLOAT16": (TensorProto.FLOAT16, np.float16),
               "BOOL": (TensorProto.BOOL, np.bool_), "int64": (I64, np.int64)}  # fmt: skip
    nodes = [helper.make_node("Cast", ["x"], [f"y_{name}"], to=name) for name in targets]
    outputs = [vi(f"y_{name}", None, elem) for name, (elem, _) in targets.items()]
    model = make(nodes, [vi("x", [2, 3])], outputs, opset=opset)
    same(run(model, {"x": x}, level), [x.astype(np_type) for _, np_type in targets.values()])


def test_cast_to_an_unsupported_or_unknown_type_name_is_refused() -> None:
    for name, shown in (("STRING", "string"), ("NOT_A_TYPE", "NOT_A_TYPE")):
        model = make([helper.make_node("Cast", ["x"], ["y"], to=name)], [vi("x", [2])], [vi("y", None)], opset=1)
        with pytest.raises(UnsupportedModelError, match=f"Cast to {shown}"):
            InferenceSession(model.SerializeToString())


# -- Tile-1: tiles and axis are inputs -----------------------------------------------------------------
@pytest.mark.parametrize("level", LEVELS)
def test_tile_before_opset_6_repeats_along_one_axis(level: str, rng) -> None:
    nodes = [helper.make_node("Tile", ["x", "tiles", "axis"], ["y"])]
    x = rng.standard_normal((2, 3)).astype(np.float32)
    for tiles, axis in ((3, 1), (2, 0), (1, 1)):
        consts = {"tiles": np.array(tiles, np.int64), "axis": np.array(axis, np.int64)}
        model = make(nodes, [vi("x", [2, 3])], [vi("y", None)], consts, opset=1)
        same(run(model, {"x": x}, level), [np.concatenate([x] * tiles, axis=axis)])
    fed = make(nodes, [vi("x", [2, 3]), vi("tiles", [], I64), vi("axis", [], I64)], [vi("y", None)], opset=5)
    for tiles, axis in ((2, 1), (3, 0)):  # values of inputs: recomputed per run
        feed = {"x": x, "tiles": np.array(tiles, np.int64), "axis": np.array(axis, np.int64)}
        same(run(fed, feed, level), [np.concatenate([x] * tiles, axis=axis)])


# -- Split-1: the sizes may come as a second input ----------------------------------------------------
@pytest.mark.parametrize("level", LEVELS)
def test_split_at_opset_1_takes_sizes_from_an_input_or_the_attribute(level: str, rng) -> None:
    x = rng.standard_normal((2, 7)).astype(np.float32)
    nodes = [helper.make_node("Split", ["x", "sizes"], ["a", "b"], axis=1)]
    model = make(nodes, [vi("x", [2, 7])], [vi("a", None), vi("b", None)], {"sizes": np.array([5, 2])}, opset=1)
    same(run(model, {"x": x}, level), [x[:, :5], x[:, 5:]])
    nodes = [helper.make_node("Split", ["x"], ["a", "b"], axis=1, split=[3, 4])]
    model = make(nodes, [vi("x", [2, 7])], [vi("a", None), vi("b", None)], opset=1)
    same(run(model, {"x": x}, level), [x[:, :3], x[:, 3:]])


# -- legacy broadcasting (opset 1 to 6): broadcast=1 with an axis aligns B at that axis of A -----------
def _aligned(b: np.ndarray, a_ndim: int, axis: int) -> np.ndarray:
    return b.reshape(b.shape + (1,) * (a_ndim - axis - b.ndim))


@pytest.mark.parametrize("opset", [1, 6])
@pytest.mark.parametrize("level", LEVELS)
def test_legacy_broadcast_with_an_axis(level: str, opset: int, rng) -> None:
    a = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    bias = rng.standard_normal((3, 4)).astype(np.float32)  # a constant B (a bias in NCHW, say)
    scale = (1.5 + rng.random(3)).astype(np.float32)  # a B fed as an input, declared with its shape
    nodes = [
        helper.make_node("Add", ["a", "bias"], ["s"], broadcast=1, axis=1),
        helper.make_node("Mul", ["s", "scale"], ["m"], broadcast=1, axis=1),
        helper.make_node("Sub", ["m", "row"], ["d"], broadcast=1),  # no axis: suffix matching
        helper.make_node("Div", ["d", "scale"], ["y"], broadcast=1, axis=1),
    ]
    consts = {"bias": bias, "row": np.arange(5, dtype=np.float32)}
    model = make(nodes, [vi("a", [2, 3, 4, 5]), vi("scale", [3])], [vi("y", None)], consts, opset=opset)
    s3 = _aligned(scale, 4, 1)
    want = ((a + _aligned(bias, 4, 1)) * s3 - np.arange(5, dtype=np.float32)) / s3
    same(run(model, {"a": a, "scale": scale}, level), [want], rtol=1e-5)


@pytest.mark.parametrize("level", LEVELS)
def test_legacy_broadcast_of_comparisons_and_pow(level: str, rng) -> None:
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    nodes = [
        helper.make_node("Greater", ["a", "b"], ["gt"], broadcast=1, axis=1),
        helper.make_node("Less", ["a", "b"], ["lt"], broadcast=1, axis=1),
        helper.make_node("Pow", ["a", "two"], ["p"], broadcast=1, axis=0),
    ]
    consts = {"two": np.array([2.0, 3.0], np.float32)}
    bools = [vi("gt", None, TensorProto.BOOL), vi("lt", None, TensorProto.BOOL)]
    model = make(nodes, [vi("a", [2, 3, 4]), vi("b", [3])], [*bools, vi("p", None)], consts, opset=6)
    b3 = b.reshape(3, 1)
    want = [a > b3, a < b3, np.power(a, np.array([2.0, 3.0], np.float32).reshape(2, 1, 1))]
    same(run(model, {"a": a, "b": b}, level), want, rtol=1e-5)


def test_legacy_broadcast_of_an_overridable_initializer_takes_the_fed_value(rng) -> None:
    """IR version 4 at opset 6: a bias listed among the inputs may be fed; its alignment applies to the feed."""
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    bias = rng.standard_normal(3).astype(np.float32)
    nodes = [helper.make_node("Add", ["a", "bias"], ["y"], broadcast=1, axis=1)]
    model = make(nodes, [vi("a", [2, 3, 4]), vi("bias", [3])], [vi("y", None)], {"bias": bias}, opset=6)
    model.ir_version = 4
    sess = InferenceSession(model.SerializeToString())
    fed = rng.standard_normal(3).astype(np.float32)
    same(sess.run(None, {"a": a}), [a + bias.reshape(3, 1)])
    same(sess.run(None, {"a": a, "bias": fed}), [a + fed.reshape(3, 1)])
    same(sess.run(None, {"a": a}), [a + bias.reshape(3, 1)])


def test_legacy_broadcast_over_inputs_of_unknown_rank_is_refused_by_name() -> None:
    nodes = [helper.make_node("Add", ["a", "b"], ["y"], broadcast=1, axis=1, name="old_add")]
    model = make(nodes, [vi("a", None), vi("b", None)], [vi("y", None)], opset=6)
    with pytest.raises(UnsupportedModelError, match=r"old_add.*axis=1"):
        InferenceSession(model.SerializeToString())


# -- attribute defaults that changed between versions ---------------------------------------------------
@pytest.mark.parametrize("level", LEVELS)
def test_selu_1_and_clip_6_use_their_own_defaults(level: str) -> None:
    x = np.array([-np.inf, -2.0, -0.5, 0.0, 0.5, np.inf], np.float32)
    selu = make([helper.make_node("Selu", ["x"], ["y"])], [vi("x", [6])], [vi("y", None)], opset=1)
    alpha, gamma = np.float32(1.6732), np.float32(1.0507)  # Selu-1's defaults (Selu-6: 1.67326..., 1.05070...)
    want = np.where(x > 0, gamma * x, gamma * alpha * (np.exp(x) - 1)).astype(np.float32)
    same(run(selu, {"x": x}, level), [want], rtol=1e-5)
    clip = make([helper.make_node("Clip", ["x"], ["y"])], [vi("x", [6])], [vi("y", None)], opset=6)
    got = run(clip, {"x": x}, level)
    big = np.finfo(np.float32).max  # Clip-6 clamps to the float range by default: inf becomes the largest float
    same(got, [np.clip(x, -big, big)])
    same(got, run_ort(clip, {"x": x}))


# -- Slice-1: starts, ends and axes are attributes -------------------------------------------------------
@pytest.mark.parametrize("level", LEVELS)
def test_slice_before_opset_10_takes_attributes(level: str, rng) -> None:
    nodes = [helper.make_node("Slice", ["x"], ["y"], starts=[1, -4], ends=[100, -1], axes=[0, -1])]
    model = make(nodes, [vi("x", [4, 6])], [vi("y", None)], opset=9)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    same(run(model, {"x": x}, level), [x[1:, -4:-1]])
    same(run(model, {"x": x}, level), run_ort(model, {"x": x}))
