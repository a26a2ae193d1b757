"""InferenceSession on Pad (1, 2, 11 to 19): modes, axes, negative pads, fed pads and values, on the CPU and
through the GPU path's PyTorch functions (run with CPU tensors); against onnxruntime and NumPy."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx_models import LEVELS, PROPERTY, make, onnxruntime, ours, randn, run_on, same, torch_run, vi
from strategies import seeds

from xpuruntime.onnx import InferenceSession, SessionOptions, UnsupportedModelError

F, D, H, I8, U8, I32, I64, B = (
    TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT8, TensorProto.UINT8,
    TensorProto.INT32, TensorProto.INT64, TensorProto.BOOL,
)  # fmt: skip
PATHS = ("numpy", "torch")


# -- Pad ------------------------------------------------------------------------------------------------------
def pad_model(mode: str, pads: list, *, value: float | None = None, axes: list | None = None, opset: int = 13,
              dtype: int = F, shape: list | None = None, fed: tuple[str, ...] = ()) -> onnx.ModelProto:  # fmt: skip
    shape = shape or [2, 3, 5, 7]
    np_type = helper.tensor_dtype_to_np_dtype(dtype)
    if opset < 11:
        key = "pads" if opset >= 2 else "paddings"
        attrs = {"mode": mode, key: pads, **({} if value is None else {"value": value})}
        return make([helper.make_node("Pad", ["x"], ["y"], **attrs)], [vi("x", shape, dtype)], [vi("y", None, dtype)],
                    opset=opset)  # fmt: skip
    values = {"pads": np.array(pads, np.int64), "value": None if value is None else np.array(value, np_type),
              "axes": None if axes is None else np.array(axes, np.int64)}  # fmt: skip
    names = ["x", "pads", "value" if value is not None else "", "axes" if axes is not None else ""]
    while not names[-1]:
        names.pop()
    inputs = [vi("x", shape, dtype)]
    inputs += [vi(n, list(values[n].shape), I64 if n != "value" else dtype) for n in names[1:] if n and n in fed]
    consts = {n: values[n] for n in names[1:] if n and n not in fed}
    node = helper.make_node("Pad", names, ["y"], mode=mode)
    return make([node], inputs, [vi("y", None, dtype)], consts, opset)


PADS = {  # begin..., end... for (2, 3, 5, 7)
    "grow": [0, 1, 2, 3, 1, 0, 4, 2], "crop": [0, 0, -2, -1, 0, -1, -1, -3], "mixed": [1, -1, 3, -2, 0, 1, -1, 4],
    "none": [0] * 8, "wide": [0, 0, 4, 6, 0, 0, 3, 5],
}  # fmt: skip


@pytest.mark.parametrize("pads", PADS)
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
@pytest.mark.parametrize("opset", [2, 10, 11, 13, 18])
def test_pad_matches_onnxruntime(opset: int, mode: str, pads: str, rng) -> None:
    """Pad-2 (pads and value as attributes) and Pad-11+ (inputs), negative pads cropping."""
    feed = {"x": randn(rng, 2, 3, 5, 7)}
    model = pad_model(mode, PADS[pads], value=2.5 if mode == "constant" else None, opset=opset)
    same(ours(model, feed), onnxruntime(model, feed), atol=0, rtol=0)


@pytest.mark.parametrize("level", LEVELS)
def test_pad_axes_wrap_dtypes_and_default_value(level: str, rng) -> None:
    x = randn(rng, 2, 3, 5, 7)
    for axes, pads in (([2, 3], [1, -2, 3, 4]), ([-1], [3, -3]), ([0, -2], [1, 2, 0, -1])):
        for mode in ("constant", "reflect", "edge", "wrap"):
            model = pad_model(mode, pads, axes=axes, opset=19)
            same(ours(model, {"x": x}, level), onnxruntime(model, {"x": x}), atol=0, rtol=0)
    # more than the dim: wraps around again (as np.pad does; some onnxruntime versions read past the input)
    wrap = pad_model("wrap", [0, 2, 9, 8, 1, 0, 12, 3], opset=19)
    same(ours(wrap, {"x": x}, level), [np.pad(x, [(0, 1), (2, 0), (9, 12), (8, 3)], mode="wrap")], atol=0, rtol=0)
    for dtype, np_type in ((I64, np.int64), (U8, np.uint8), (I32, np.int32)):
        ints = {"x": rng.integers(1, 200, (2, 3, 5, 7)).astype(np_type)}
        for value in (None, 7):
            model = pad_model("constant", PADS["mixed"], value=value, dtype=dtype)
            same(ours(model, ints, level), onnxruntime(model, ints), atol=0, rtol=0)


def test_pad_1_paddings_and_bool(rng) -> None:
    """Pad-1 (`paddings`; onnxruntime has no kernel) and bool data (against np.pad)."""
    x = randn(rng, 3, 5)
    for mode in ("constant", "reflect", "edge"):
        model = pad_model(mode, [1, 2, 3, 1], value=1.5 if mode == "constant" else None, opset=1, shape=[3, 5])
        kwargs = {"constant_values": 1.5} if mode == "constant" else {}
        same(ours(model, {"x": x}), [np.pad(x, [(1, 3), (2, 1)], mode=mode, **kwargs)], atol=0, rtol=0)
    flags = {"x": rng.random((3, 5)) > 0.5}
    model = pad_model("constant", [0, 1, 2, 0], value=True, dtype=B, shape=[3, 5])
    same(ours(model, flags), [np.pad(flags["x"], [(0, 2), (1, 0)], constant_values=True)], atol=0, rtol=0)


@pytest.mark.parametrize("level", LEVELS)
def test_pad_with_fed_pads_and_value(level: str, rng) -> None:
    x = randn(rng, 2, 3, 5, 7)
    model = pad_model("constant", PADS["grow"], value=0.5, fed=("pads", "value"))
    sess = InferenceSession(model.SerializeToString(), SessionOptions(graph_optimization_level=level))
    for pads, value in ((PADS["grow"], 0.5), (PADS["mixed"], -3.0), (PADS["grow"], 1.0)):
        feed = {"x": x, "pads": np.array(pads, np.int64), "value": np.array(value, np.float32)}
        same(sess.run(None, feed), onnxruntime(model, feed), atol=0, rtol=0)


def _np_pad(x: np.ndarray, widths: list[tuple[int, int]], mode: str, value: float) -> np.ndarray:
    """np.pad with negative widths cropping first (the independent reference)."""
    crop = tuple(slice(max(-b, 0), x.shape[i] - max(-e, 0)) for i, (b, e) in enumerate(widths))
    positive = [(max(b, 0), max(e, 0)) for b, e in widths]
    kwargs = {"constant_values": value} if mode == "constant" else {}
    return np.pad(x[crop], positive, mode=mode, **kwargs)


@given(
    seed=seeds,
    shape=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    mode=st.sampled_from(["constant", "reflect", "edge", "wrap"]),
    data=st.data(),
)
@PROPERTY
def test_pad_property_matches_numpy(seed, shape, mode, data) -> None:
    rng = np.random.default_rng(seed)
    widths = [
        (data.draw(st.integers(-(n // 2), 8)), data.draw(st.integers(-(n - n // 2) + 1, 8))) for n in shape
    ]  # at least one element left per dim
    pads = [b for b, _ in widths] + [e for _, e in widths]
    x = randn(rng, *shape)
    model = pad_model(mode, pads, value=-1.25 if mode == "constant" else None, opset=19, shape=list(shape))
    same(ours(model, {"x": x}), [_np_pad(x, widths, mode, -1.25)], atol=0, rtol=0)


def test_pad_through_the_torch_path(torch_session, rng) -> None:
    x = randn(rng, 2, 3, 5, 7)
    for mode in ("constant", "reflect", "edge", "wrap"):
        for pads in PADS.values():
            model = pad_model(mode, pads, value=3.5 if mode == "constant" else None, opset=19)
            same(torch_run(torch_session, model, {"x": x}), ours(model, {"x": x}), atol=0, rtol=0)
    flags = {"x": rng.random((3, 5)) > 0.5}
    model = pad_model("constant", [0, 1, 2, -1], value=True, dtype=B, shape=[3, 5])
    same(torch_run(torch_session, model, flags), ours(model, flags), atol=0, rtol=0)


def test_pad_declines_a_mode_its_opset_lacks() -> None:
    model = pad_model("wrap", PADS["grow"], opset=18)
    with pytest.raises(UnsupportedModelError, match=r"\(Pad\): attribute mode='wrap' is not supported at opset 18"):
        InferenceSession(model.SerializeToString())


# -- Pad: a negative pad larger than the dim, with a positive pad on the other side --------------------------
def _pad_reference(x: np.ndarray, begin: int, end: int, value: float) -> np.ndarray:
    """Pad's definition along the last axis: output j reads input j - begin, or the value outside the input."""
    n = x.shape[-1]
    out = np.full((*x.shape[:-1], n + begin + end), value, x.dtype)
    for j in range(out.shape[-1]):
        if 0 <= j - begin < n:
            out[..., j] = x[..., j - begin]
    return out


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("pads", [(-7, 9), (9, -7), (-6, 3), (3, -6)])
def test_pad_crop_past_the_dim_then_pad_keeps_the_spec_output_size(pads: tuple, path: str, torch_session, rng) -> None:
    """x[..., 5] padded by (begin=-7, end=9) has 5 - 7 + 9 = 7 elements, all the constant (onnxruntime, and
    the spec's output shape); the session crops to nothing first and then pads 9: 9 elements."""
    x = randn(rng, 2, 5)
    begin, end = pads
    node = helper.make_node("Pad", ["x", "pads", "value"], ["y"], mode="constant")
    consts = {"pads": np.array([0, begin, 0, end], np.int64), "value": np.array(1.25, np.float32)}
    model = make([node], [vi("x", [2, 5])], [vi("y", None)], consts, 13)
    want = _pad_reference(x, begin, end, 1.25)
    np.testing.assert_array_equal(onnxruntime(model, {"x": x})[0], want)
    got = run_on(path, torch_session, model, {"x": x})[0]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)
