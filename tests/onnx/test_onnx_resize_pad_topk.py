"""InferenceSession on Resize (10 to 19) and Upsample (1, 7, 9), Pad (1, 2, 11 to 19), TopK (1, 10, 11),
Dropout (1 to 22) and PRelu's old per-channel form, on the CPU and through the GPU path's PyTorch op map
(run with CPU tensors). Checked against onnxruntime wherever it runs the model, else against the ONNX
reference evaluator or NumPy; random inputs with odd sizes, and hypothesis properties."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from onnx_models import make, onnxruntime, ours, torch_path_builder, vi
from strategies import seeds

from xpuruntime.onnx import InferenceSession, NodeExecutionError, SessionOptions, UnsupportedModelError

F, D, H, I8, U8, I32, I64, B = (
    TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT8, TensorProto.UINT8,
    TensorProto.INT32, TensorProto.INT64, TensorProto.BOOL,
)  # fmt: skip
LEVELS = ("disabled", "basic", "all")
PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def reference(model: onnx.ModelProto, feed: dict) -> list[np.ndarray]:
    """The ONNX reference evaluator (for what onnxruntime does not run)."""
    return ReferenceEvaluator(model).run(None, feed)


def same(got: list, want: list, atol: float = 1e-5, rtol: float = 1e-5) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        w = np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape, f"got {g.dtype}{g.shape}, expected {w.dtype}{w.shape}"
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def randn(rng: np.random.Generator, *shape: int, dtype: type = np.float32) -> np.ndarray:
    x = rng.standard_normal(shape) * 3
    return (x + np.where(x >= 0, 0.01, -0.01)).astype(dtype)  # never zero


@pytest.fixture(scope="module")
def torch_session():
    """A session builder through the GPU path's PyTorch op map, with CPU tensors (onnx_models)."""
    pytest.importorskip("torch")
    return torch_path_builder()


def torch_run(build, model: onnx.ModelProto, feed: dict) -> list[np.ndarray]:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. PyTorch's "The given NumPy array is not writable"
        return build(model).run(None, {k: v.copy() for k, v in feed.items()})


# -- Resize ------------------------------------------------------------------------------------------------
def resize_model(
    attrs: dict, shape: list, *, scales: list | None = None, sizes: list | None = None, roi: list | None = None,
    opset: int = 13, dtype: int = F, fed: tuple[str, ...] = (),
) -> onnx.ModelProto:  # fmt: skip
    """Resize(x, roi, scales, sizes) with the given inputs as constants (or graph inputs when in `fed`)."""
    values = {"roi": None if roi is None else np.array(roi, np.float32),
              "scales": None if scales is None else np.array(scales, np.float32),
              "sizes": None if sizes is None else np.array(sizes, np.int64)}  # fmt: skip
    if opset < 11:
        names = ["x", "scales"]
    else:
        names = ["x", "roi" if roi is not None else "", "scales" if scales is not None else "", "sizes"]
        names = names if sizes is not None else names[:3]
        if opset < 13 and not names[1]:  # Resize-11: roi and scales are required (maybe empty)
            names[1], values["roi"] = "roi", np.zeros(0, np.float32)
        if opset < 13 and not names[2]:
            names[2], values["scales"] = "scales", np.zeros(0, np.float32)
    inputs = [vi("x", shape, dtype)]
    consts = {}
    for name in names[1:]:
        if not name:
            continue
        if name in fed:
            inputs.append(vi(name, [len(values[name])], I64 if name == "sizes" else F))
        else:
            consts[name] = values[name]
    node = helper.make_node("Resize", names, ["y"], **attrs)
    return make([node], inputs, [vi("y", None, dtype)], consts, opset)


COORDINATES = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_crop_and_resize"]
RESIZE_SHAPE = [2, 3, 5, 7]
RESIZE_TARGETS = {  # scales (N and C stay) or sizes, up and down, whole and fractional
    "scales_up": {"scales": [1, 1, 1.6, 2.3]}, "scales_down": {"scales": [1, 1, 0.6, 0.45]},
    "scales_mixed": {"scales": [1, 1, 3.0, 0.5]}, "sizes_up": {"sizes": [2, 3, 9, 11]},
    "sizes_down": {"sizes": [2, 3, 3, 4]}, "sizes_to_one": {"sizes": [2, 3, 1, 5]},
}  # fmt: skip
ROI = [0, 0, 0.15, 0.3, 1, 1, 0.8, 1.2]  # the last axis reaches past the input: extrapolated


@pytest.mark.parametrize("target", RESIZE_TARGETS)
@pytest.mark.parametrize("coordinates", COORDINATES)
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_matches_onnxruntime(mode: str, coordinates: str, target: str, rng) -> None:
    attrs = {"mode": mode, "coordinate_transformation_mode": coordinates}
    roi = None
    if coordinates == "tf_crop_and_resize":
        attrs["extrapolation_value"] = -7.5
        roi = ROI
    model = resize_model(attrs, RESIZE_SHAPE, roi=roi, **RESIZE_TARGETS[target])
    feed = {"x": randn(rng, *RESIZE_SHAPE)}
    same(ours(model, feed), onnxruntime(model, feed))


@pytest.mark.parametrize("coordinates", [*COORDINATES, "tf_half_pixel_for_nn"])
@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
def test_resize_nearest_modes_match_onnxruntime(nearest_mode: str, coordinates: str, rng) -> None:
    """Nearest-neighbour ties (x_original exactly halfway) land where onnxruntime puts them."""
    attrs = {"mode": "nearest", "nearest_mode": nearest_mode, "coordinate_transformation_mode": coordinates}
    roi = ROI if coordinates == "tf_crop_and_resize" else None
    feed = {"x": randn(rng, *RESIZE_SHAPE)}
    for target in ({"scales": [1, 1, 2.0, 3.0]}, {"scales": [1, 1, 0.5, 1.5]}, {"sizes": [2, 3, 8, 3]}):
        model = resize_model(attrs, RESIZE_SHAPE, roi=roi, opset=11, **target)
        same(ours(model, feed), onnxruntime(model, feed), atol=0, rtol=0)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize(("a", "exclude"), [(-0.75, 0), (-0.5, 1), (-0.6, 0)])
def test_resize_cubic_coefficient_and_exclude_outside(a: float, exclude: int, level: str, rng) -> None:
    feed = {"x": randn(rng, 1, 2, 6, 9)}
    for target in ({"scales": [1, 1, 1.7, 0.8]}, {"sizes": [1, 2, 3, 17]}):
        attrs = {"mode": "cubic", "cubic_coeff_a": a, "exclude_outside": exclude}
        model = resize_model(attrs, [1, 2, 6, 9], **target)
        # float32 sums of four weighted taps of inputs up to ~10: the GPU path rounds apart by ~1e-5
        same(ours(model, feed, level), onnxruntime(model, feed), atol=5e-5)


@pytest.mark.parametrize("opset", [18, 19])
def test_resize_axes_and_keep_aspect_ratio_policy(opset: int, rng) -> None:
    feed = {"x": randn(rng, 2, 3, 5, 7)}
    for policy in ("stretch", "not_larger", "not_smaller"):
        for axes, sizes in (([2, 3], [9, 4]), ([3, 2], [10, 3]), ([3], [3])):
            attrs = {"mode": "linear", "axes": axes, "keep_aspect_ratio_policy": policy}
            model = resize_model(attrs, [2, 3, 5, 7], sizes=sizes, opset=opset)
            same(ours(model, feed), onnxruntime(model, feed))
            # negative axes: onnxruntime leaves them out of the aspect-ratio policy; they name the same axes
            negative = resize_model({**attrs, "axes": [a - 4 for a in axes]}, [2, 3, 5, 7], sizes=sizes, opset=opset)
            same(ours(negative, feed), onnxruntime(model, feed))
    for mode in ("nearest", "cubic"):
        attrs = {"mode": mode, "axes": [3, 2], "coordinate_transformation_mode": "tf_crop_and_resize"}
        model = resize_model(attrs, [2, 3, 5, 7], scales=[1.5, 0.7], roi=[0.1, 0.2, 0.9, 1.1], opset=opset)
        same(ours(model, feed), onnxruntime(model, feed))


def test_resize_half_pixel_symmetric_matches_onnxruntime(rng) -> None:
    """(Scales chosen so that no x_original is exactly halfway, where float rounding picks the neighbour.)"""
    feed = {"x": randn(rng, 1, 3, 7, 5)}
    for mode in ("nearest", "linear", "cubic"):
        for scales in ([1, 1, 1.7, 2.2], [1, 1, 0.7, 0.45], [1, 1, 1.3, 0.8]):
            attrs = {"mode": mode, "coordinate_transformation_mode": "half_pixel_symmetric"}
            model = resize_model(attrs, [1, 3, 7, 5], scales=scales, opset=19)
            same(ours(model, feed), onnxruntime(model, feed))


@pytest.mark.parametrize("coordinates", ["half_pixel", "align_corners", "asymmetric"])
def test_resize_linear_in_3d_and_5d(coordinates: str, rng) -> None:
    """Linear is N-linear: trilinear on the last three axes of a 5-D input (as onnxruntime runs it), and
    every axis at once, where onnxruntime declines and the ONNX reference decides."""
    attrs = {"mode": "linear", "coordinate_transformation_mode": coordinates}
    feed = {"x": randn(rng, 1, 2, 3, 4, 5)}
    model = resize_model(attrs, [1, 2, 3, 4, 5], scales=[1, 1, 2.0, 1.5, 0.6])
    same(ours(model, feed), onnxruntime(model, feed))
    feed3 = {"x": randn(rng, 3, 4, 5)}
    model = resize_model(attrs, [3, 4, 5], sizes=[5, 7, 2])
    same(ours(model, feed3), onnxruntime(model, feed3))
    model = resize_model(attrs, [1, 2, 3, 4, 5], sizes=[2, 3, 5, 2, 4])
    same(ours(model, feed), reference(model, feed))


@pytest.mark.parametrize("dtype", [U8, I8, I32])
def test_resize_of_integers(dtype: int, rng) -> None:
    """Nearest copies integers exactly (as onnxruntime). Linear and cubic interpolate in float64, then
    round half to even and saturate, as the ONNX reference (onnxruntime truncates: at most 1 away)."""
    np_type = helper.tensor_dtype_to_np_dtype(dtype)
    info = np.iinfo(np_type)
    feed = {"x": rng.integers(max(info.min, -1000), min(info.max, 1000), (2, 3, 5, 7), endpoint=True).astype(np_type)}
    nearest = resize_model({"mode": "nearest"}, [2, 3, 5, 7], scales=[1, 1, 1.6, 0.7], dtype=dtype)
    same(ours(nearest, feed), onnxruntime(nearest, feed), atol=0, rtol=0)
    linear = resize_model({"mode": "linear"}, [2, 3, 5, 7], scales=[1, 1, 1.6, 0.7], dtype=dtype)
    got = ours(linear, feed)
    same(got, reference(linear, feed), atol=1, rtol=0)
    same(got, onnxruntime(linear, feed), atol=1, rtol=0)
    wide = resize_model({"mode": "linear"}, [2, 3, 5, 7], scales=[1, 1, 1.6, 0.7], dtype=D)
    same(got, [np.rint(ours(wide, {"x": feed["x"].astype(np.float64)})[0]).astype(np_type)], atol=0, rtol=0)
    edges = {"x": np.where(rng.random((2, 3, 5, 7)) > 0.5, info.max, info.min).astype(np_type)}
    cubic = resize_model({"mode": "cubic"}, [2, 3, 5, 7], scales=[1, 1, 1.6, 2.3], dtype=dtype)
    got = ours(cubic, edges)[0]  # cubic overshoots the input's range: saturated
    assert got.min() == info.min and got.max() == info.max
    # (float32 coordinates, as onnxruntime's, move the weights by ~1e-7: thousands at int32's extremes)
    same([got], reference(cubic, edges), atol=max(1.0, 4e-6 * info.max), rtol=0)


def test_resize_linear_that_changes_nothing_keeps_int64_exact(torch_session, rng) -> None:
    """Linear or cubic with every axis kept as it is copies the data: int64 beyond 2**53 is not rounded
    through float64 (on either path)."""
    feed = {"x": rng.integers(2**60, 2**62, (1, 2, 3, 5)) + 1}
    for mode, target in (("linear", {"scales": [1, 1, 1, 1]}), ("cubic", {"sizes": [1, 2, 3, 5]})):
        model = resize_model({"mode": mode}, [1, 2, 3, 5], dtype=I64, **target)
        same(ours(model, feed), [feed["x"]], atol=0, rtol=0)
        same(torch_run(torch_session, model, feed), [feed["x"]], atol=0, rtol=0)


def test_resize_linear_of_bool_is_that_of_0_and_1(torch_session, rng) -> None:
    """Neither the spec, onnxruntime nor the reference defines linear or cubic Resize of bool: the session
    resizes it as uint8 0 and 1 (rounded half to even), alike on both paths."""
    feed = {"x": rng.random((1, 2, 4, 5)) > 0.5}
    for mode in ("linear", "cubic"):
        model = resize_model({"mode": mode}, [1, 2, 4, 5], scales=[1, 1, 1.5, 0.6], dtype=B)
        as_bytes = resize_model({"mode": mode}, [1, 2, 4, 5], scales=[1, 1, 1.5, 0.6], dtype=U8)
        want = [ours(as_bytes, {"x": feed["x"].astype(np.uint8)})[0] != 0]
        same(ours(model, feed), want, atol=0, rtol=0)
        same(torch_run(torch_session, model, feed), want, atol=0, rtol=0)


def test_resize_of_float16_and_float64(rng) -> None:
    feed = {"x": randn(rng, 1, 2, 5, 7, dtype=np.float16)}
    for mode in ("nearest", "linear", "cubic"):
        model = resize_model({"mode": mode}, [1, 2, 5, 7], scales=[1, 1, 1.4, 2.2], dtype=H)
        same(ours(model, feed), onnxruntime(model, feed), atol=2e-3, rtol=2e-3)
        wide = resize_model({"mode": mode}, [1, 2, 5, 7], scales=[1, 1, 1.4, 2.2], dtype=D)
        x64 = {"x": feed["x"].astype(np.float64)}  # onnxruntime has no float64 Resize
        same(ours(wide, x64), [ours(model, {"x": feed["x"]})[0].astype(np.float64)], atol=5e-3, rtol=5e-3)


@pytest.mark.parametrize("level", LEVELS)
def test_resize_with_fed_scales_sizes_and_roi(level: str, rng) -> None:
    """Scales, sizes or roi fed per run: the output shape follows each run's values."""
    x = randn(rng, 1, 2, 5, 7)
    model = resize_model({"mode": "linear"}, [1, 2, 5, 7], scales=[1, 1, 1, 1], fed=("scales",))
    sess = InferenceSession(model.SerializeToString(), SessionOptions(graph_optimization_level=level))
    for scales in ([1, 1, 2.0, 0.5], [1, 1, 0.6, 1.3], [1, 1, 2.0, 0.5]):
        feed = {"x": x, "scales": np.array(scales, np.float32)}
        same(sess.run(None, feed), onnxruntime(model, feed))
    model = resize_model({"mode": "cubic"}, [1, 2, 5, 7], sizes=[1, 2, 1, 1], fed=("sizes",))
    sess = InferenceSession(model.SerializeToString(), SessionOptions(graph_optimization_level=level))
    for sizes in ([1, 2, 9, 3], [1, 2, 4, 10]):
        feed = {"x": x, "sizes": np.array(sizes, np.int64)}
        same(sess.run(None, feed), onnxruntime(model, feed))
    attrs = {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize"}
    model = resize_model(attrs, [1, 2, 5, 7], sizes=[1, 2, 4, 6], roi=ROI, fed=("roi",))
    for roi in (ROI, [0, 0, 0.5, -0.2, 1, 1, 0.9, 0.7]):
        feed = {"x": x, "roi": np.array(roi, np.float32)}
        same(ours(model, feed, level), onnxruntime(model, feed))


@pytest.mark.parametrize("level", LEVELS)
def test_resize_sizes_from_shape_as_exporters_write_them(level: str, rng) -> None:
    """PyTorch's export of interpolate(size=...): sizes = Concat(Shape(x)[:2], target)."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Slice", ["shape", "zero", "two"], ["nc"]),
        helper.make_node("Concat", ["nc", "hw"], ["sizes"], axis=0),
        helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="linear",
                         coordinate_transformation_mode="pytorch_half_pixel"),
    ]  # fmt: skip
    consts = {"zero": np.array([0]), "two": np.array([2]), "hw": np.array([11, 3])}
    model = make(nodes, [vi("x", ["n", 3, "h", "w"])], [vi("y", None)], consts)
    for shape in ((2, 3, 5, 7), (1, 3, 8, 4)):
        feed = {"x": randn(rng, *shape)}
        same(ours(model, feed, level), onnxruntime(model, feed))


def _on_a_boundary(coordinates: str, nearest: bool, rounding: str, n_in: int, n_out: int, scale: float,
                   roi: tuple[float, float]) -> np.ndarray:  # fmt: skip
    """Output positions whose x_original (the spec's formulas, in float64) lies within 1e-4 of where the
    result jumps: a rounding tie of nearest, or the edge of tf_crop_and_resize's extrapolation. There the
    last bit of float rounding decides, differently in every implementation."""
    x = np.arange(n_out, dtype=np.float64)
    wide = n_out > 1
    x = {
        "asymmetric": x / scale, "half_pixel": (x + 0.5) / scale - 0.5,
        "pytorch_half_pixel": (x + 0.5) / scale - 0.5 if wide else 0 * x,
        "align_corners": x * (n_in - 1) / (n_out - 1) if wide else 0 * x,
        "tf_crop_and_resize": roi[0] * (n_in - 1) + x * (roi[1] - roi[0]) * (n_in - 1) / (n_out - 1) if wide
        else 0 * x + 0.5 * (roi[0] + roi[1]) * (n_in - 1),
    }[coordinates]  # fmt: skip
    near = np.zeros(n_out, bool)
    if nearest:
        frac = x - np.floor(x)
        boundary = 0.5 if rounding.startswith("round") else 0.0
        near |= (np.abs(frac - boundary) < 1e-4) | (np.abs(frac - boundary - 1) < 1e-4)
    if coordinates == "tf_crop_and_resize":
        near |= (np.abs(x) < 1e-4) | (np.abs(x - (n_in - 1)) < 1e-4)
    return near


@given(
    seed=seeds,
    mode=st.sampled_from(["nearest", "linear", "cubic"]),
    coordinates=st.sampled_from(COORDINATES),
    nearest_mode=st.sampled_from(["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]),
    dims=st.tuples(st.integers(1, 9), st.integers(1, 9)),
    factors=st.tuples(*[st.sampled_from([0.25, 0.4, 0.5, 0.6, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 3.3])] * 2),
    by_sizes=st.booleans(),
)
@PROPERTY
def test_resize_property_matches_onnxruntime(seed, mode, coordinates, nearest_mode, dims, factors, by_sizes) -> None:
    rng = np.random.default_rng(seed)
    shape = [2, 3, *dims]
    attrs = {"mode": mode, "coordinate_transformation_mode": coordinates, "nearest_mode": nearest_mode}
    if not by_sizes and int(np.float32(min(factors)) * min(dims)) == 0:
        factors = tuple(max(f, 1.0) for f in factors)  # an empty output: onnxruntime refuses it
    sizes = [max(1, round(d * f)) for d, f in zip(dims, factors)]
    target = {"sizes": [2, 3, *sizes]} if by_sizes else {"scales": [1, 1, *factors]}
    kept = sizes if by_sizes else [int(np.float32(f) * np.float32(d)) for d, f in zip(dims, factors)]
    assume(list(kept) != list(dims) or set(factors) == {1.0})  # onnxruntime copies such inputs (see below)
    roi = [0, 0, *rng.uniform(-0.2, 0.5, 2).round(2), 1, 1, *rng.uniform(0.5, 1.2, 2).round(2)]
    for i, (dim, factor, size) in enumerate(zip(dims, factors, sizes)):
        if (size == dim) if by_sizes else factor == 1.0:
            roi[2 + i], roi[6 + i] = 0.0, 1.0  # onnxruntime ignores the roi of an axis kept at its size
    model = resize_model(attrs, shape, roi=roi if coordinates == "tf_crop_and_resize" else None, **target)
    feed = {"x": randn(rng, *shape)}
    got, want = ours(model, feed)[0], onnxruntime(model, feed)[0]
    assert got.shape == want.shape and got.dtype == want.dtype
    keep = np.ones(got.shape[2:], bool)
    for i, (dim, out) in enumerate(zip(dims, got.shape[2:])):
        scale = out / dim if by_sizes else float(np.float32(factors[i]))
        if scale == 1.0 and out == dim:
            continue  # an axis left as it is
        tie = _on_a_boundary(coordinates, mode == "nearest", nearest_mode, dim, out, scale, (roi[2 + i], roi[6 + i]))
        keep &= ~tie.reshape((-1, 1) if i == 0 else (1, -1))
    np.testing.assert_allclose(got[..., keep], want[..., keep], rtol=1e-5, atol=1e-4)


def test_resize_to_the_same_shape_with_a_scale_still_resamples(rng) -> None:
    """A scale of 1.1 on a dim of 7 keeps 7 positions, at 1/1.1 spacing (the spec and its reference;
    onnxruntime copies any input whose output shape is its own)."""
    feed = {"x": randn(rng, 1, 2, 4, 7)}
    for mode in ("nearest", "linear", "cubic"):
        for coordinates in ("half_pixel", "asymmetric", "pytorch_half_pixel"):
            attrs = {"mode": mode, "coordinate_transformation_mode": coordinates}
            model = resize_model(attrs, [1, 2, 4, 7], scales=[1, 1, 1.2, 1.1])
            got = ours(model, feed)
            same(got, reference(model, feed))
            assert not np.allclose(got[0], feed["x"])


def test_resize_crop_of_an_axis_kept_at_its_size(rng) -> None:
    """tf_crop_and_resize to the input's own size still crops to the roi (the spec and its reference;
    onnxruntime skips every axis whose scale is 1, roi included)."""
    feed = {"x": randn(rng, 1, 2, 4, 5)}
    roi = [0, 0, -0.2, 0.3, 1, 1, 0.7, 0.9]
    for mode in ("nearest", "linear", "cubic"):
        attrs = {"mode": mode, "coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": -1.0}
        for target in ({"scales": [1, 1, 1, 1]}, {"sizes": [1, 2, 4, 5]}, {"scales": [1, 1, 1, 2]}):
            model = resize_model(attrs, [1, 2, 4, 5], roi=roi, **target)
            same(ours(model, feed), reference(model, feed), atol=1e-5)


def test_resize_through_the_torch_path(torch_session, rng) -> None:
    feed = {"x": randn(rng, 2, 3, 5, 7)}
    for mode in ("nearest", "linear", "cubic"):
        for coordinates in COORDINATES:
            roi = ROI if coordinates == "tf_crop_and_resize" else None
            attrs = {"mode": mode, "coordinate_transformation_mode": coordinates, "extrapolation_value": 2.5}
            for target in ({"scales": [1, 1, 1.6, 0.45]}, {"sizes": [2, 3, 1, 9]}):
                model = resize_model(attrs, [2, 3, 5, 7], roi=roi, **target)
                same(torch_run(torch_session, model, feed), ours(model, feed))
    ints = {"x": rng.integers(0, 255, (2, 3, 5, 7)).astype(np.uint8)}
    model = resize_model({"mode": "linear"}, [2, 3, 5, 7], scales=[1, 1, 1.6, 0.7], dtype=U8)
    same(torch_run(torch_session, model, ints), ours(model, ints), atol=0)


def test_resize_declines_unknown_attribute_values() -> None:
    cases = [
        ({"mode": "linear", "antialias": 2}, 18, "antialias=2 is not supported; supported: 0, 1"),
        ({"mode": "bicubic"}, 13, "mode='bicubic'.*supported: nearest, linear, cubic"),
        ({"coordinate_transformation_mode": "tf_half_pixel_for_nn"}, 13, "coordinate_transformation_mode="),
        ({"mode": "nearest", "nearest_mode": "round"}, 13, "nearest_mode='round'.*round_prefer_floor"),
        ({"keep_aspect_ratio_policy": "fit"}, 18, "keep_aspect_ratio_policy='fit'.*not_larger"),
        ({"mode": "cubic"}, 10, "mode='cubic'.*supported: nearest, linear"),
    ]
    for attrs, opset, message in cases:
        node = helper.make_node("Resize", ["x", "scales"] if opset < 11 else ["x", "", "scales"], ["y"],
                                name="up", **attrs)  # fmt: skip
        model = make([node], [vi("x", [1, 1, 2, 2])], [vi("y", None)], {"scales": np.ones(4, np.float32)}, opset)
        with pytest.raises(UnsupportedModelError, match=f"node 'up' \\(Resize\\): attribute {message}"):
            InferenceSession(model.SerializeToString())


# -- Resize with antialias (Resize-18, 19) ---------------------------------------------------------------------
# onnxruntime and the ONNX reference agree on antialias: the filter is stretched by 1/scale on an axis that
# shrinks, weights are the kernel of the scaled distance normalized to sum 1, and taps outside the input
# take the edge value (exclude_outside=1: weight 0, renormalized). onnxruntime runs linear on 2-D to 5-D
# inputs and cubic on 2-D and 4-D (two outer or outermost and innermost scales 1); elsewhere the
# reference decides. Both decline antialias with mode nearest, which the spec leaves to linear and cubic:
# the session runs it as nearest without.
AA_SHAPE = [2, 3, 11, 13]
AA_TARGETS = {  # down, mixed and whole-axis-to-one
    "scales_down": {"scales": [1, 1, 0.6, 0.3]}, "scales_mixed": {"scales": [1, 1, 1.7, 0.45]},
    "sizes_down": {"sizes": [2, 3, 4, 5]}, "sizes_to_one": {"sizes": [2, 3, 1, 2]},
}  # fmt: skip
AA_COORDINATES = [*COORDINATES, "half_pixel_symmetric"]


def aa_model(attrs: dict, shape: list, opset: int = 19, **target) -> onnx.ModelProto:
    """Resize with antialias=1 (Resize-18 and 19 define it)."""
    return resize_model({"antialias": 1, **attrs}, shape, opset=opset, **target)


@pytest.mark.parametrize("target", AA_TARGETS)
@pytest.mark.parametrize("coordinates", AA_COORDINATES)
@pytest.mark.parametrize(("mode", "exclude"), [("linear", 0), ("linear", 1), ("cubic", 0), ("cubic", 1)])
def test_resize_antialias_matches_onnxruntime(mode: str, exclude: int, coordinates: str, target: str, rng) -> None:
    """Odd 4-D sizes, every coordinate mode (tf_crop_and_resize extrapolating), shrinking and growing axes."""
    attrs = {"mode": mode, "exclude_outside": exclude, "coordinate_transformation_mode": coordinates}
    roi = ROI if coordinates == "tf_crop_and_resize" else None
    model = aa_model({**attrs, "extrapolation_value": -7.5}, AA_SHAPE, roi=roi, **AA_TARGETS[target])
    feed = {"x": randn(rng, *AA_SHAPE)}
    try:
        want = onnxruntime(model, feed)
    except ort.capi.onnxruntime_pybind11_state.RuntimeException as exc:
        if "narrowing_error" not in str(exc):
            raise
        pytest.skip(f"onnxruntime {ort.__version__} fails on this model (narrowing_error); newer releases run it")
    same(ours(model, feed), want)


@pytest.mark.parametrize("opset", [18, 19])
def test_resize_antialias_2d_cubic_coefficient_and_channels_last(opset: int, rng) -> None:
    """2-D inputs, cubic_coeff_a, and 4-D resized on the middle axes (N, H, W, C), against onnxruntime."""
    flat = {"x": randn(rng, 11, 13)}
    for mode in ("linear", "cubic"):
        for a, exclude in ((-0.75, 0), (-0.5, 1), (-0.6, 0)):
            attrs = {"mode": mode, "cubic_coeff_a": a, "exclude_outside": exclude}
            for target in ({"scales": [0.45, 0.7]}, {"sizes": [4, 5]}, {"scales": [0.2, 1.6]}):
                model = aa_model(attrs, [11, 13], opset, **target)
                same(ours(model, flat), onnxruntime(model, flat))
            model = aa_model(attrs, AA_SHAPE, opset, scales=[1, 0.4, 0.5, 1])
            feed = {"x": randn(rng, *AA_SHAPE)}
            same(ours(model, feed), onnxruntime(model, feed))


@pytest.mark.parametrize("opset", [18, 19])
def test_resize_antialias_axes_and_keep_aspect_ratio_policy(opset: int, rng) -> None:
    feed = {"x": randn(rng, *AA_SHAPE)}
    for mode in ("linear", "cubic"):
        for policy in ("stretch", "not_larger", "not_smaller"):
            for axes, sizes in (([2, 3], [5, 9]), ([3, 2], [5, 3]), ([2, 3], [4, 17])):
                attrs = {"mode": mode, "axes": axes, "keep_aspect_ratio_policy": policy, "exclude_outside": 1}
                model = aa_model(attrs, AA_SHAPE, opset, sizes=sizes)
                same(ours(model, feed), onnxruntime(model, feed))
                # negative axes: onnxruntime leaves them out of the aspect-ratio policy; they name the same axes
                negative = aa_model({**attrs, "axes": [a - 4 for a in axes]}, AA_SHAPE, opset, sizes=sizes)
                same(ours(negative, feed), onnxruntime(model, feed))
        model = aa_model({"mode": mode, "axes": [3, 2]}, AA_SHAPE, opset, scales=[0.3, 0.55])
        same(ours(model, feed), onnxruntime(model, feed))
    three = {"x": randn(rng, 5, 13, 11)}
    model = aa_model({"mode": "linear", "axes": [1]}, [5, 13, 11], opset, scales=[0.4])
    same(ours(model, three), onnxruntime(model, three))


def test_resize_antialias_where_onnxruntime_declines_matches_the_reference(rng) -> None:
    """Cubic on 1-D, 3-D and 5-D inputs, and axes onnxruntime's cubic does not take, against the ONNX
    reference. (It differs from onnxruntime, and from the spec, in align_corners and tf_crop_and_resize
    with a scale that makes a fractional output length: it divides by scale * length - 1 where the spec
    says length_resized - 1; onnxruntime follows the spec there, and so does the session. And where an
    x_original lies an ulp below a whole number, as half_pixel_symmetric's can, the reference's window
    slips one tap left of its weights, antialias or not: that mode is left to onnxruntime.)"""
    cases = [
        ([13], {"scales": [0.4]}), ([5, 13, 11], {"scales": [0.6, 0.5, 0.4]}), ([5, 13, 11], {"sizes": [2, 13, 17]}),
        ([1, 2, 9, 7, 11], {"scales": [1, 1, 0.6, 1.5, 0.3]}),
    ]  # fmt: skip
    for shape, target in cases:
        feed = {"x": randn(rng, *shape)}
        for exclude in (0, 1):
            for coordinates in ("half_pixel", "asymmetric", "pytorch_half_pixel"):
                attrs = {"mode": "cubic", "exclude_outside": exclude, "coordinate_transformation_mode": coordinates}
                model = aa_model(attrs, shape, **target)
                same(ours(model, feed), reference(model, feed))
    feed = {"x": randn(rng, 5, 13, 11)}
    for mode in ("linear", "cubic"):
        model = aa_model({"mode": mode, "axes": [0, 1]}, [5, 13, 11], sizes=[3, 4])
        same(ours(model, feed), reference(model, feed))
        crop = aa_model({"mode": mode, "coordinate_transformation_mode": "tf_crop_and_resize"}, [5, 13, 11],
                        sizes=[2, 5, 3], roi=[0, 0.1, -0.2, 1, 0.8, 1.1])  # fmt: skip
        same(ours(crop, feed), reference(crop, feed))


def test_resize_antialias_low_passes_and_leaves_upsampling_alone(rng) -> None:
    """Halving with antialias averages over (1, 3, 3, 1) / 8 (linear, half_pixel): a checkerboard at the
    Nyquist frequency comes out flat inside. Axes that grow, and mode nearest, resize as without antialias."""
    x = np.tile(np.array([1.0, -1.0], np.float32), 6)[None, None, None, :].repeat(3, axis=2)  # (1, 1, 3, 12)
    got = ours(aa_model({"mode": "linear"}, [1, 1, 3, 12], scales=[1, 1, 1, 0.5]), {"x": x})[0]
    padded = np.pad(x[0, 0, 0], 1, mode="edge")
    want = np.array([padded[2 * i : 2 * i + 4] @ np.array([1, 3, 3, 1]) / 8 for i in range(6)], np.float32)
    same([got[0, 0, 0]], [want], atol=1e-6)
    assert np.all(np.abs(got[..., 1:-1]) < 1e-6) and np.all(got[..., 0] == 0.25) and np.all(got[..., -1] == -0.25)
    feed = {"x": randn(rng, *AA_SHAPE)}
    for mode, exclude in (("nearest", 0), ("linear", 0), ("linear", 1), ("cubic", 0), ("cubic", 1)):
        for scales in ([1, 1, 1.7, 2.3], [1, 1, 1, 3.0], [1, 1, 0.6, 0.45]):
            if mode != "nearest" and min(scales) < 1:
                continue
            attrs = {"mode": mode, "exclude_outside": exclude}
            model, plain = aa_model(attrs, AA_SHAPE, scales=scales), resize_model(attrs, AA_SHAPE, scales=scales)
            same(ours(model, feed), ours(plain, feed), atol=0, rtol=0)
            same(ours(model, feed), onnxruntime(plain if mode == "nearest" else model, feed))


@pytest.mark.parametrize("level", LEVELS)
def test_resize_antialias_of_integers_float16_and_fed_scales(level: str, rng) -> None:
    """uint8 and int8 as the reference (interpolated, rounded half to even and saturated; onnxruntime
    rounds its fixed-point uint8 sums, 1 away at most, and runs int8 through the same uint8 table, which
    clips negative values to 0), float16 as onnxruntime; scales fed per run."""
    u8 = {"x": rng.integers(0, 256, AA_SHAPE).astype(np.uint8)}
    i8 = {"x": rng.integers(-128, 128, AA_SHAPE).astype(np.int8)}
    for mode in ("linear", "cubic"):
        for data, dtype in ((u8, U8), (i8, I8)):
            model = aa_model({"mode": mode}, AA_SHAPE, scales=[1, 1, 0.6, 0.3], dtype=dtype)
            same(ours(model, data, level), reference(model, data), atol=1, rtol=0)
            if dtype == U8:
                same(ours(model, data, level), onnxruntime(model, data), atol=1, rtol=0)
        half = aa_model({"mode": mode}, AA_SHAPE, scales=[1, 1, 0.6, 0.3], dtype=H)
        x16 = {"x": randn(rng, *AA_SHAPE, dtype=np.float16)}
        same(ours(half, x16, level), onnxruntime(half, x16), atol=2e-3, rtol=2e-3)
    model = aa_model({"mode": "cubic"}, AA_SHAPE, scales=[1, 1, 1, 1], fed=("scales",))
    sess = InferenceSession(model.SerializeToString(), SessionOptions(graph_optimization_level=level))
    x = randn(rng, *AA_SHAPE)
    for scales in ([1, 1, 0.5, 0.25], [1, 1, 1.5, 0.7], [1, 1, 0.5, 0.25]):
        feed = {"x": x, "scales": np.array(scales, np.float32)}
        same(sess.run(None, feed), onnxruntime(model, feed))


@given(
    seed=seeds,
    mode=st.sampled_from(["linear", "cubic"]),
    exclude=st.booleans(),
    coordinates=st.sampled_from([c for c in AA_COORDINATES if c != "tf_crop_and_resize"]),
    dims=st.tuples(st.integers(1, 23), st.integers(1, 23)),
    factors=st.tuples(*[st.sampled_from([0.1, 0.2, 0.25, 0.3, 0.45, 0.5, 0.6, 0.75, 0.9, 1.0, 1.5, 2.5])] * 2),
    by_sizes=st.booleans(),
)
@PROPERTY
def test_resize_antialias_property(seed, mode, exclude, coordinates, dims, factors, by_sizes) -> None:
    """Random shapes and factors against onnxruntime; and, the weights summing to 1, a constant stays."""
    rng = np.random.default_rng(seed)
    sizes = [max(1, round(d * f)) for d, f in zip(dims, factors)]
    if not by_sizes:
        factors = tuple(f if int(np.float32(f) * d) else 1.0 for f, d in zip(factors, dims))  # no empty output
    kept = sizes if by_sizes else [int(np.float32(f) * np.float32(d)) for d, f in zip(dims, factors)]
    assume(list(kept) != list(dims) or set(factors) == {1.0})  # onnxruntime copies such inputs
    target = {"sizes": [2, 3, *sizes]} if by_sizes else {"scales": [1, 1, *factors]}
    attrs = {"mode": mode, "exclude_outside": int(exclude), "coordinate_transformation_mode": coordinates}
    model = aa_model(attrs, [2, 3, *dims], **target)
    feed = {"x": randn(rng, 2, 3, *dims)}
    same(ours(model, feed), onnxruntime(model, feed), atol=1e-4)
    flat = np.full((2, 3, *dims), rng.uniform(-5, 5), np.float32)
    got = ours(model, {"x": flat})[0]
    np.testing.assert_allclose(got, np.full_like(got, flat.flat[0]), rtol=1e-5)


def test_resize_antialias_through_the_torch_path(torch_session, rng) -> None:
    """The GPU path applies the same per-axis tables (PyTorch ops, here on CPU tensors)."""
    feed = {"x": randn(rng, *AA_SHAPE)}
    for mode in ("linear", "cubic"):
        for exclude in (0, 1):
            for coordinates in ("half_pixel", "align_corners", "tf_crop_and_resize"):
                roi = ROI if coordinates == "tf_crop_and_resize" else None
                attrs = {"mode": mode, "exclude_outside": exclude, "coordinate_transformation_mode": coordinates}
                for target in AA_TARGETS.values():
                    model = aa_model(attrs, AA_SHAPE, roi=roi, **target)
                    same(torch_run(torch_session, model, feed), ours(model, feed))
        flat = {"x": randn(rng, 11, 13)}
        attrs = {"mode": mode, "axes": [1, 0], "keep_aspect_ratio_policy": "not_larger"}
        model = aa_model(attrs, [11, 13], sizes=[6, 4])
        same(torch_run(torch_session, model, flat), onnxruntime(model, flat))
    ints = {"x": rng.integers(0, 256, AA_SHAPE).astype(np.uint8)}
    model = aa_model({"mode": "cubic"}, AA_SHAPE, scales=[1, 1, 0.6, 0.3], dtype=U8)
    same(torch_run(torch_session, model, ints), ours(model, ints), atol=0)


# -- Upsample and Resize-10 -----------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [[1.0, 1.0, 2.0, 3.0], [1.0, 1.0, 1.5, 2.5], [1.0, 1.0, 1.0, 1.7]])
def test_upsample_7_and_9_match_onnxruntime(scales: list, mode: str, rng) -> None:
    feed = {"x": randn(rng, 2, 3, 5, 7)}
    seven = make([helper.make_node("Upsample", ["x"], ["y"], mode=mode, scales=scales)], [vi("x", [2, 3, 5, 7])],
                 [vi("y", None)], opset=7)  # fmt: skip
    nine = make([helper.make_node("Upsample", ["x", "s"], ["y"], mode=mode)], [vi("x", [2, 3, 5, 7])],
                [vi("y", None)], {"s": np.array(scales, np.float32)}, opset=9)  # fmt: skip
    for model in (seven, nine):
        for level in LEVELS:
            same(ours(model, feed, level), onnxruntime(model, feed))


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_10_matches_onnxruntime(mode: str, rng) -> None:
    """Resize-10: asymmetric coordinates; nearest takes the floor upsampling and the ceiling downsampling."""
    feed = {"x": randn(rng, 2, 3, 5, 9)}
    for scales in ([1, 1, 2.0, 1.5], [1, 1, 0.6, 0.35], [1, 1, 1.7, 0.5]):
        model = resize_model({"mode": mode}, [2, 3, 5, 9], scales=scales, opset=10)
        same(ours(model, feed), onnxruntime(model, feed))


@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
def test_upsample_1_height_and_width_scales(mode: str, rng) -> None:
    """Experimental Upsample-1 (onnxruntime has no kernel): as onnxruntime's Upsample-9 on scales [1, 1, h, w]."""
    feed = {"x": randn(rng, 2, 3, 4, 5)}
    node = helper.make_node("Upsample", ["x"], ["y"], mode=mode, height_scale=2.0, width_scale=3.0)
    model = make([node], [vi("x", [2, 3, 4, 5])], [vi("y", None)], opset=1)
    nine = make([helper.make_node("Upsample", ["x", "s"], ["y"], mode="linear" if mode == "bilinear" else mode)],
                [vi("x", [2, 3, 4, 5])], [vi("y", None)], {"s": np.array([1, 1, 2, 3], np.float32)}, opset=9)  # fmt: skip
    same(ours(model, feed), onnxruntime(nine, feed))


def test_upsample_through_the_torch_path(torch_session, rng) -> None:
    feed = {"x": randn(rng, 1, 2, 3, 5)}
    for mode in ("nearest", "linear"):
        model = make([helper.make_node("Upsample", ["x"], ["y"], mode=mode, scales=[1, 1, 2.5, 1.5])],
                     [vi("x", [1, 2, 3, 5])], [vi("y", None)], opset=7)  # fmt: skip
        same(torch_run(torch_session, model, feed), onnxruntime(model, feed))


def test_upsample_errors_name_upsample(torch_session, rng) -> None:
    feed = {"x": randn(rng, 1, 2, 3, 5)}
    model = make([helper.make_node("Upsample", ["x", "s"], ["y"])], [vi("x", [1, 2, 3, 5])], [vi("y", None)],
                 {"s": np.array([1, 2, 3], np.float32)}, opset=9)  # fmt: skip
    for run in (ours, lambda m, f: torch_run(torch_session, m, f)):
        with pytest.raises(NodeExecutionError, match="Upsample: scales has 3 values for 4 axes"):
            run(model, feed)


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


# -- Dropout --------------------------------------------------------------------------------------------------
def dropout_model(opset: int, *, mask: bool = True, ratio: float | None = None, training: bool | None = None,
                  fed: tuple[str, ...] = (), attrs: dict | None = None, dtype: int = F) -> onnx.ModelProto:  # fmt: skip
    mask_type = B if opset >= 10 else dtype
    outputs = [vi("y", None, dtype)] + ([vi("mask", None, mask_type)] if mask else [])
    inputs, consts, names = [vi("x", [3, 4, 5], dtype)], {}, ["x"]
    if opset >= 12:
        for name, value, elem in (("ratio", ratio, F), ("training", training, B)):
            if value is None and name not in fed:
                names.append("")
                continue
            names.append(name)
            if name in fed:
                inputs.append(vi(name, [], elem))
            else:
                consts[name] = np.array(value, np.float32 if name == "ratio" else np.bool_)
        while not names[-1]:
            names.pop()
    elif ratio is not None:
        attrs = {**(attrs or {}), "ratio": ratio}
    node = helper.make_node("Dropout", names, [o.name for o in outputs], **(attrs or {}))
    return make([node], inputs, outputs, consts, opset)


@pytest.mark.parametrize("opset", [7, 9, 10, 12, 13, 22])
@pytest.mark.parametrize("level", LEVELS)
def test_dropout_is_the_identity_in_inference(opset: int, level: str, rng) -> None:
    feed = {"x": randn(rng, 3, 4, 5)}
    model = dropout_model(opset, ratio=0.3, training=False if opset >= 12 else None)
    y, mask = ours(model, feed, level)
    want_y, want_mask = onnxruntime(model, feed)
    same([y], [want_y], atol=0, rtol=0)
    # onnxruntime's Dropout-7 to -11 kernels return an all-zero mask; the spec (and its reference): nothing
    # is dropped, every element kept
    want = np.ones((3, 4, 5), np.bool_ if opset >= 10 else np.float32)
    same([mask], [want if opset < 12 else want_mask], atol=0, rtol=0)
    plain = dropout_model(opset, mask=False)
    same(ours(plain, feed, level), onnxruntime(plain, feed), atol=0, rtol=0)
    assert "Dropout" not in InferenceSession(plain.SerializeToString()).original.op_counts()  # now an Identity


@pytest.mark.parametrize("opset", [1, 6])
def test_dropout_before_opset_7_follows_is_test(opset: int, rng) -> None:
    feed = {"x": randn(rng, 3, 4, 5)}
    model = dropout_model(opset, attrs={"is_test": 1}, ratio=0.4)
    y, mask = ours(model, feed)
    same([y, mask], [feed["x"], np.ones((3, 4, 5), np.float32)], atol=0, rtol=0)
    for attrs in ({"is_test": 0}, {}):  # is_test=0 (the default) is training: random
        training = dropout_model(opset, attrs=attrs, mask=False)
        with pytest.raises(UnsupportedModelError, match=r"\(Dropout\): is_test=0 makes Dropout drop values"):
            InferenceSession(training.SerializeToString())
    same(ours(dropout_model(opset, attrs={}, ratio=0.0), feed), [feed["x"], np.ones((3, 4, 5), np.float32)])


def test_dropout_training_mode(rng) -> None:
    """A constant training_mode=True is declined at load time, a fed one refused when a run sets it; with
    ratio 0 nothing is dropped either way."""
    feed = {"x": randn(rng, 3, 4, 5)}
    with pytest.raises(UnsupportedModelError, match=r"node 'Dropout_0' \(Dropout\): training_mode=True makes"):
        InferenceSession(dropout_model(13, training=True).SerializeToString())
    with pytest.raises(UnsupportedModelError, match="training_mode=True"):
        InferenceSession(dropout_model(13, ratio=0.5, training=True).SerializeToString())
    zero = dropout_model(13, ratio=0.0, training=True)
    same(ours(zero, feed), onnxruntime(zero, feed), atol=0, rtol=0)
    fed = dropout_model(13, ratio=0.25, fed=("training",))
    sess = InferenceSession(fed.SerializeToString())
    off = {**feed, "training": np.array(False)}
    same(sess.run(None, off), onnxruntime(fed, off), atol=0, rtol=0)
    with pytest.raises(NodeExecutionError, match=r"Dropout.*training_mode=True with a ratio above 0"):
        sess.run(None, {**feed, "training": np.array(True)})
    both = dropout_model(13, fed=("ratio", "training"))
    feed_zero = {**feed, "ratio": np.array(0.0, np.float32), "training": np.array(True)}
    same(ours(both, feed_zero), onnxruntime(both, feed_zero), atol=0, rtol=0)


def test_an_overridable_training_flag_is_not_folded_away(rng) -> None:
    """training_mode as an overridable initializer (False by default): a feed of True must reach the node."""
    model = dropout_model(13, mask=False, ratio=0.5, training=False)
    model.graph.input.append(vi("training", [], B))
    sess = InferenceSession(model.SerializeToString())
    x = randn(rng, 3, 4, 5)
    same(sess.run(None, {"x": x}), [x], atol=0, rtol=0)
    with pytest.raises(NodeExecutionError, match="training_mode=True with a ratio above 0"):
        sess.run(None, {"x": x, "training": np.array(True)})


def test_dropout_through_the_torch_path(torch_session, rng) -> None:
    feed = {"x": randn(rng, 3, 4, 5)}
    for opset in (7, 10, 13):
        model = dropout_model(opset, ratio=0.2)
        same(torch_run(torch_session, model, feed), ours(model, feed), atol=0, rtol=0)
    fed = dropout_model(13, fed=("training",))
    session = torch_session(fed)
    same(session.run(None, {**feed, "training": np.array(False)}), ours(fed, {**feed, "training": np.array(False)}))
    with pytest.raises(NodeExecutionError, match="training_mode=True"):
        session.run(None, {**feed, "training": np.array(True)})


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


# -- the GPU path's constants ---------------------------------------------------------------------------------------
def test_gpu_path_moves_read_only_initializers_without_a_warning(torch_session, rng, monkeypatch) -> None:
    """Initializers come from onnx as read-only arrays: torch.from_numpy would warn that it may write them
    (once per process, so the test also watches what reaches it). A 0-d initializer stays 0-d."""
    torch = pytest.importorskip("torch")
    seen: list[bool] = []
    from_numpy = torch.from_numpy

    def spy(array: np.ndarray):
        seen.append(array.flags.writeable)
        return from_numpy(array)

    monkeypatch.setattr(torch, "from_numpy", spy)
    weight = randn(rng, 5, 3)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "bias"], ["y"]),
             helper.make_node("Mul", ["s", "c"], ["z"])]  # fmt: skip
    consts = {"w": weight, "bias": randn(rng, 3), "c": np.array(1.5, np.float32)}
    model = make(nodes, [vi("x", [4, 5]), vi("s", [])], [vi("y", None), vi("z", None)], consts)
    feed = {"x": randn(rng, 4, 5), "s": np.array(2.5, np.float32)}
    got = torch_run(torch_session, model, feed)
    same(got, onnxruntime(model, feed))
    assert got[1].shape == ()
    assert seen and all(seen)


def test_gpu_path_runs_every_new_op_in_one_graph(torch_session, rng) -> None:
    nodes = [
        helper.make_node("Pad", ["x", "pads"], ["p"], mode="reflect"),
        helper.make_node("Resize", ["p", "", "scales"], ["r"], mode="cubic"),
        helper.make_node("Dropout", ["r"], ["d"]),
        helper.make_node("TopK", ["d", "k"], ["v", "i"], axis=-1),
    ]
    consts = {"pads": np.array([0, 0, 1, 2, 0, 0, 2, 1]), "scales": np.array([1, 1, 1.5, 0.7], np.float32),
              "k": np.array([3])}  # fmt: skip
    model = make(nodes, [vi("x", [2, 3, 5, 7])], [vi("v", None), vi("i", None, I64)], consts)
    feed = {"x": randn(rng, 2, 3, 5, 7)}
    got = torch_run(torch_session, model, feed)
    same(got, onnxruntime(model, feed))
    same(got, ours(model, feed))


@pytest.mark.gpu
def test_new_ops_on_cuda_with_cuda_graphs(rng) -> None:
    pytest.importorskip("torch")
    nodes = [
        helper.make_node("Pad", ["x", "pads"], ["p"], mode="edge"),
        helper.make_node("Resize", ["p", "", "scales"], ["r"], mode="linear"),
        helper.make_node("TopK", ["r", "k"], ["v", "i"], axis=-1),
    ]
    consts = {"pads": np.array([0, 0, 1, 2, 0, 0, 2, 1]), "scales": np.array([1, 1, 1.5, 0.7], np.float32),
              "k": np.array([3])}  # fmt: skip
    model = make(nodes, [vi("x", [2, 3, 5, 7])], [vi("r", None), vi("v", None), vi("i", None, I64)], consts)
    session = InferenceSession(model.SerializeToString(), SessionOptions(enable_cuda_graph=True), device="cuda")
    for _ in range(3):
        feed = {"x": randn(rng, 2, 3, 5, 7)}
        (r, v, i), (want_r, want_v, _) = session.run(None, feed), onnxruntime(model, feed)
        same([r, v], [want_r, want_v])
        # edge padding makes equal neighbours, which the GPU's interpolation may leave 1 ulp apart: a tie
        # on one side is not on the other, so the indices are checked by what they pick
        np.testing.assert_array_equal(np.take_along_axis(r, i, -1), v)
        assert all(len(set(row)) == 3 for row in i.reshape(-1, 3).tolist())
    assert {entry.note for entry in session._backend.entries.values()} == {"CUDA graph captured"}
