"""InferenceSession on elementwise ops: PRelu's old per-channel form, Casts to float16 inside fused chains; the
bitwise ops, BitShift-28's out-of-range shifts, BitCast, the trigonometric ops and the newer activations, on
the CPU and through the GPU path's PyTorch functions (CPU tensors)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx_models import LEVELS, RNG, check_reference, make, onnxruntime, ours, randn, run_on, same, session_at, vi

from xpuruntime.onnx import InferenceSession, NodeExecutionError

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


# -- bitwise ops, BitShift, BitCast ---------------------------------------------------------------------------------
def _bitshift_reference(x: np.ndarray, y: np.ndarray, left: bool) -> np.ndarray:
    """BitShift-28 with Python integers: a shift of < 0 or >= the width gives the sign fill (-1 or 0)."""
    bits = x.dtype.itemsize * 8
    out = []
    for a, s in zip(x.reshape(-1).tolist(), np.broadcast_to(y, x.shape).reshape(-1).tolist()):
        if not 0 <= s < bits:
            out.append(-1 if (a < 0 and not left) else 0)
        elif left:
            wrapped = (a << s) & ((1 << bits) - 1)
            out.append(wrapped - (1 << bits) if x.dtype.kind == "i" and wrapped >> (bits - 1) else wrapped)
        else:
            out.append(a >> s)
    return np.array(out, x.dtype).reshape(x.shape)


@pytest.mark.parametrize("path", ["numpy", "torch"])
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8])
def test_bitshift_and_bitwise_ops(path: str, dtype: type, torch_session, rng) -> None:
    info = np.iinfo(dtype)
    bits = info.bits
    x = rng.integers(info.min, info.max, (3, 4), dtype=dtype, endpoint=True)
    y = rng.integers(-2, bits + 2, (4,)).astype(dtype) if info.min < 0 else rng.integers(0, bits + 2, (4,), dtype=dtype)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes = [helper.make_node("BitShift", ["x", "y"], ["left"], direction="LEFT"),
             helper.make_node("BitShift", ["x", "y"], ["right"], direction="RIGHT"),
             helper.make_node("BitwiseAnd", ["x", "y"], ["a"]), helper.make_node("BitwiseOr", ["x", "y"], ["o"]),
             helper.make_node("BitwiseXor", ["x", "y"], ["e"]), helper.make_node("BitwiseNot", ["x"], ["n"])]  # fmt: skip
    outs = ["left", "right", "a", "o", "e", "n"]
    model = make(nodes, [vi("x", [3, 4], elem), vi("y", [4], elem)], [vi(o, None, elem) for o in outs], opset=28)
    got = run_on(path, torch_session, model, {"x": x, "y": y})
    want = [_bitshift_reference(x, y, True), _bitshift_reference(x, y, False), x & y, x | y, x ^ y, ~x]
    same(got, want, atol=0, rtol=0)


@pytest.mark.parametrize("path", ["numpy", "torch"])
def test_bitcast_reads_the_same_bytes(path: str, torch_session, rng) -> None:
    x = randn(rng, 2, 3)
    there = helper.make_node("BitCast", ["x"], ["i"], to=TensorProto.INT32)
    back = helper.make_node("BitCast", ["i"], ["y"], to=F)
    model = make([there, back], [vi("x", [2, 3])], [vi("i", None, TensorProto.INT32), vi("y", None)], opset=26)
    same(run_on(path, torch_session, model, {"x": x}), [x.view(np.int32), x], atol=0, rtol=0)
    wide = make([helper.make_node("BitCast", ["x"], ["y"], to=TensorProto.INT64)], [vi("x", [2])],
                [vi("y", None, TensorProto.INT64)], opset=26)  # fmt: skip
    with pytest.raises(NodeExecutionError, match=r"BitCast: float32 .* cannot be read as int64"):
        InferenceSession(wide.SerializeToString()).run(None, {"x": randn(rng, 2)})


# -- trigonometry and activations ------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["numpy", "torch"])
def test_trig_and_activation_ops_match_onnxruntime(path: str, torch_session, rng) -> None:
    x = rng.uniform(-0.95, 0.95, (3, 5)).astype(np.float32)  # inside every inverse function's domain
    ops = {"Tan": {}, "Asin": {}, "Acos": {}, "Atan": {}, "Sinh": {}, "Cosh": {}, "Asinh": {}, "Atanh": {},
           "Mish": {}, "Shrink": {"lambd": 0.3, "bias": 0.1}}  # fmt: skip
    nodes = [helper.make_node(op, ["x"], [op.lower()], **attrs) for op, attrs in ops.items()]
    nodes.append(helper.make_node("Acosh", ["x1"], ["acosh"]))
    nodes.append(helper.make_node("Add", ["x", "two"], ["x1"]))
    outs = [vi(op.lower(), None) for op in ops] + [vi("acosh", None)]
    model = make(nodes, [vi("x", [3, 5])], outs, {"two": np.float32(2.0)}, opset=22)
    same(run_on(path, torch_session, model, {"x": x}), onnxruntime(model, {"x": x}), atol=1e-6)
    swish = make([helper.make_node("Swish", ["x"], ["y"], alpha=0.7), helper.make_node("SwiGLU", ["x", "x"], ["g"])],
                 [vi("x", [3, 5])], [vi("y", None), vi("g", None)], opset=28)  # fmt: skip
    x64 = x.astype(np.float64)
    want = [x64 / (1 + np.exp(-0.7 * x64)), x64 * x64 / (1 + np.exp(-x64))]
    same(run_on(path, torch_session, swish, {"x": x}), [w.astype(np.float32) for w in want], atol=1e-6)


@pytest.mark.parametrize("path", ["numpy", "torch"])
def test_isinf_detects_the_signs_asked_for(path: str, torch_session) -> None:
    x = np.array([-np.inf, -1.0, 0.0, np.nan, 2.0, np.inf], np.float32)
    nodes = [helper.make_node("IsInf", ["x"], [f"y{n}{p}"], detect_negative=n, detect_positive=p)
             for n in (0, 1) for p in (0, 1)]  # fmt: skip
    model = make(nodes, [vi("x", [6])], [vi(n.output[0], None, TensorProto.BOOL) for n in nodes], opset=20)
    want = [np.zeros(6, bool), np.isposinf(x), np.isneginf(x), np.isinf(x)]
    same(run_on(path, torch_session, model, {"x": x}), want, atol=0, rtol=0)
