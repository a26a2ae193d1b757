"""InferenceSession on elementwise ops: PRelu's old per-channel form, Casts to float16 inside fused chains."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx_models import LEVELS, RNG, check_reference, make, onnxruntime, ours, randn, same, session_at, vi

F, H = TensorProto.FLOAT, TensorProto.FLOAT16


# -- PRelu-1 and PRelu-6: one slope per channel -------------------------------------------------------------------
def _prelu(x: np.ndarray, slope: np.ndarray) -> np.ndarray:
    return np.where(x < 0, x * slope, x).astype(x.dtype)


@pytest.mark.parametrize("opset", [1, 6])
@pytest.mark.parametrize("level", LEVELS)
def test_prelu_before_opset_7_applies_a_1d_slope_per_channel(opset: int, level: str, rng) -> None:
    x = randn(rng, 2, 3, 5, 7)
    slope = rng.uniform(0.05, 0.9, 3).astype(np.float32)
    per_channel = slope.reshape(3, 1, 1)
    nodes = [helper.make_node("PRelu", ["x", "slope"], ["y"])]
    model = make(nodes, [vi("x", [2, 3, 5, 7])], [vi("y", None)], {"slope": slope}, opset)
    seven = make(nodes, [vi("x", [2, 3, 5, 7])], [vi("y", None)], {"slope": per_channel}, 7)
    same(ours(model, {"x": x}, level), onnxruntime(seven, {"x": x}), atol=0, rtol=0)
    same(ours(model, {"x": x}, level), [_prelu(x, per_channel)], atol=0, rtol=0)
    fed = make(nodes, [vi("x", [2, 3, 5, 7]), vi("slope", [3])], [vi("y", None)], opset=opset)  # a fed slope
    same(ours(fed, {"x": x, "slope": slope}, level), [_prelu(x, per_channel)], atol=0, rtol=0)
    unknown = make(nodes, [vi("x", ["n", "c", "h", "w"])], [vi("y", None)], {"slope": slope}, opset)
    same(ours(unknown, {"x": x}, level), [_prelu(x, per_channel)], atol=0, rtol=0)
    one = make(nodes, [vi("x", [2, 3, 5, 7])], [vi("y", None)], {"slope": np.array([0.3], np.float32)}, opset)
    same(ours(one, {"x": x}, level), [_prelu(x, np.float32(0.3))], atol=0, rtol=0)
    rows = randn(rng, 4, 3)  # N x C: NumPy's rule already lines the slope up with the channels
    flat = make(nodes, [vi("x", [4, 3])], [vi("y", None)], {"slope": slope}, opset)
    same(ours(flat, {"x": rows}, level), [_prelu(rows, slope)], atol=0, rtol=0)


def test_prelu_from_opset_7_broadcasts_as_numpy(rng) -> None:
    x = randn(rng, 2, 3, 5, 7)
    for opset in (7, 9, 16):
        slope = rng.uniform(0.05, 0.9, 7).astype(np.float32)  # along the last axis
        model = make([helper.make_node("PRelu", ["x", "slope"], ["y"])], [vi("x", [2, 3, 5, 7])], [vi("y", None)],
                     {"slope": slope}, opset)  # fmt: skip
        same(ours(model, {"x": x}), onnxruntime(model, {"x": x}), atol=0, rtol=0)


# -- PRelu-1/6 with an input whose rank the model does not declare -----------------------------------------------
@pytest.mark.parametrize("opset", [1, 6])
def test_prelu_before_opset_7_is_per_channel_when_the_input_shape_is_undeclared(opset: int, rng) -> None:
    """The per-channel rewrite needs the input's rank at load time; without it the 1-D slope broadcasts
    along the last axis (here also of size 3), so the same model gives another answer than with the shape
    declared (and than PRelu-7 on the per-channel slope in onnxruntime)."""
    x = randn(rng, 2, 3, 4, 3)
    slope = rng.uniform(0.05, 0.9, 3).astype(np.float32)
    nodes = [helper.make_node("PRelu", ["x", "slope"], ["y"])]
    undeclared = make(nodes, [vi("x", None)], [vi("y", None)], {"slope": slope}, opset)
    declared = make(nodes, [vi("x", [2, 3, 4, 3])], [vi("y", None)], {"slope": slope}, opset)
    seven = make(nodes, [vi("x", [2, 3, 4, 3])], [vi("y", None)], {"slope": slope.reshape(3, 1, 1)}, 7)
    want = onnxruntime(seven, {"x": x})[0]
    np.testing.assert_array_equal(ours(declared, {"x": x})[0], want)
    np.testing.assert_array_equal(ours(undeclared, {"x": x})[0], want)


def test_fused_chain_keeps_the_rounding_of_a_cast_to_float16() -> None:
    """Cast(float32 -> float16) rounds before the float16 math that follows, fused or not."""
    nodes = [
        helper.make_node("Cast", ["x"], ["h"], to=H),
        helper.make_node("Sub", ["h", "one"], ["d"]),
        helper.make_node("Mul", ["d", "k"], ["y"]),
    ]
    consts = {"one": np.float16(1), "k": np.float16(3)}
    model = make(nodes, [vi("x", [4, 9])], [vi("y", [4, 9], H)], consts)
    x = (1 + RNG.random((4, 9)) * 2e-3).astype(np.float32)  # between float16 steps near 1
    for level in LEVELS:
        check_reference(session_at(model, level), model, {"x": x}, rtol=1e-3)
