"""Conv, ConvTranspose and the pools on random shapes and attributes (odd sizes, groups, dilations, strides,
asymmetric pads, auto_pad, ceil_mode) against onnxruntime, on every path: PyTorch's CPU kernels, the NumPy
im2col fallback (the core without PyTorch), and the GPU path's PyTorch functions (CPU tensors here)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx_models import (
    cpu_kernels_on_tensors,
    make,
    onnxruntime,
    optimize_as_cuda,
    ours,
    randn,
    reference,
    same,
    torch_run,
    vi,
)
from strategies import seeds

from xpuruntime.onnx import NodeExecutionError
from xpuruntime.onnx.ops import conv as conv_module

F = TensorProto.FLOAT
PATHS = ("cpu_torch", "numpy", "torch")
PROPERTY = settings(  # the path fixture holds for every example of a test
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)


def run(path: str, torch_session, model, feed: dict) -> list[np.ndarray]:
    if path == "torch":
        return torch_run(torch_session, model, feed)
    return ours(model, feed)


@pytest.fixture
def on_path(request, monkeypatch):
    """The path a test runs on: the CPU with PyTorch's kernels, the CPU with NumPy only, or the GPU path."""
    path = request.param
    if path == "numpy":
        monkeypatch.setattr(conv_module, "CPU_TORCH", False)
    elif path == "cpu_torch":
        pytest.importorskip("torch")
    return path


def conv_case(rng, rank: int, group: int, transpose: bool, data) -> tuple:
    spatial = [data.draw(st.integers(3, 9 if rank < 3 else 5)) for _ in range(rank)]
    kernel = [data.draw(st.integers(1, 3)) for _ in range(rank)]
    strides = [data.draw(st.integers(1, 3)) for _ in range(rank)]
    dilations = [data.draw(st.integers(1, 2)) for _ in range(rank)]
    per_group_in, per_group_out = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    c, m = per_group_in * group, per_group_out * group
    attrs = {"kernel_shape": kernel, "strides": strides, "dilations": dilations, "group": group}
    auto = data.draw(st.sampled_from(["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    if auto == "NOTSET":
        attrs["pads"] = [data.draw(st.integers(0, k - 1)) for k in kernel * 2]
    else:
        attrs["auto_pad"] = auto
    if transpose:
        attrs["output_padding"] = [data.draw(st.integers(0, max(s, d) - 1)) for s, d in zip(strides, dilations)]
        w = randn(rng, c, per_group_out, *kernel)
    else:
        w = randn(rng, m, per_group_in, *kernel)
    node = helper.make_node("ConvTranspose" if transpose else "Conv", ["x", "w", "b"], ["y"], **attrs)
    bias = randn(rng, w.shape[1] * group if transpose else m)
    model = make([node], [vi("x", [2, c, *spatial])], [vi("y", None)], {"w": w, "b": bias}, 17)
    return model, {"x": randn(rng, 2, c, *spatial)}


@pytest.mark.parametrize("on_path", PATHS, indirect=True)
@pytest.mark.parametrize("transpose", [False, True])
@given(seed=seeds, rank=st.integers(1, 3), group=st.sampled_from([1, 2, 3]), data=st.data())
@PROPERTY
def test_conv_matches_onnxruntime(on_path, transpose, torch_session, seed, rank, group, data) -> None:
    rng = np.random.default_rng(seed)
    model, feed = conv_case(rng, rank, group, transpose, data)
    try:
        want = onnxruntime(model, feed)
    except Exception:  # a geometry onnxruntime refuses (e.g. auto_pad with output_padding): skip the example
        return
    same(run(on_path, torch_session, model, feed), want, atol=1e-4, rtol=1e-4)


def test_depthwise_conv_with_asymmetric_pads_and_float16(rng) -> None:
    """MobileNet's depthwise 3x3 (group = channels) with pads only on one side, and a float16 model."""
    node = helper.make_node("Conv", ["x", "w"], ["y"], group=8, pads=[0, 1, 2, 0], strides=[2, 2])
    for dtype, onnx_type in ((np.float32, F), (np.float16, TensorProto.FLOAT16)):
        model = make([node], [vi("x", [1, 8, 11, 9], onnx_type)], [vi("y", None, onnx_type)],
                     {"w": randn(rng, 8, 1, 3, 3, dtype=dtype)}, 17)  # fmt: skip
        feed = {"x": randn(rng, 1, 8, 11, 9, dtype=dtype)}
        want = onnxruntime(model, feed)
        tol = 1e-4 if dtype == np.float32 else 1e-2
        same(ours(model, feed), want, atol=tol, rtol=tol)


def pool_case(rng, op: str, rank: int, data) -> tuple:
    spatial = [data.draw(st.integers(2, 9 if rank < 3 else 5)) for _ in range(rank)]
    kernel = [data.draw(st.integers(1, min(3, n))) for n in spatial]
    attrs = {"kernel_shape": kernel, "strides": [data.draw(st.integers(1, 3)) for _ in range(rank)]}
    if data.draw(st.booleans()):
        attrs["pads"] = [data.draw(st.integers(0, k - 1)) for k in kernel * 2]
        attrs["ceil_mode"] = int(data.draw(st.booleans()))
    else:
        attrs["auto_pad"] = data.draw(st.sampled_from(["SAME_UPPER", "SAME_LOWER", "VALID"]))
        steps = zip(spatial, kernel, attrs["strides"])
        if attrs["auto_pad"] != "VALID" and any((-(-n // s) - 1) * s + k < n for n, k, s in steps):
            attrs["auto_pad"] = "VALID"  # onnxruntime pads SAME negatively there (and reads outside with Indices)
        attrs["count_include_pad"] = int(data.draw(st.booleans()))
    if op == "MaxPool" and data.draw(st.booleans()) and "auto_pad" not in attrs:
        attrs["dilations"] = [data.draw(st.integers(1, 2)) for _ in range(rank)]
        pads = attrs["pads"]
        spans = [(k - 1) * d + 1 for k, d in zip(kernel, attrs["dilations"])]
        if any(w > n + pads[i] + pads[rank + i] for i, (n, w) in enumerate(zip(spatial, spans))):
            del attrs["dilations"]  # a dilated kernel wider than the padded input: no valid pool
    outputs = ["y", "i"] if op == "MaxPool" and data.draw(st.booleans()) else ["y"]
    node = helper.make_node(op, ["x"], outputs, **attrs)
    out_vi = [vi("y", None)] + ([vi("i", None, TensorProto.INT64)] if len(outputs) == 2 else [])
    return make([node], [vi("x", [2, 3, *spatial])], out_vi, {}, 17), {"x": randn(rng, 2, 3, *spatial)}


@pytest.mark.parametrize("on_path", ["numpy", "torch"], indirect=True)
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@given(seed=seeds, rank=st.integers(1, 3), data=st.data())
@PROPERTY
def test_pool_matches_onnxruntime(on_path, op, torch_session, seed, rank, data) -> None:
    rng = np.random.default_rng(seed)
    model, feed = pool_case(rng, op, rank, data)
    try:
        want = onnxruntime(model, feed)
    except Exception:  # a geometry onnxruntime refuses
        return
    same(run(on_path, torch_session, model, feed), want, atol=1e-5, rtol=1e-5)


def test_conv_errors_name_the_op_and_the_shapes(rng) -> None:
    node = helper.make_node("Conv", ["x", "w"], ["y"], group=2)
    model = make([node], [vi("x", [1, 3, 5, 5])], [vi("y", None)], {"w": randn(rng, 4, 1, 3, 3)}, 17)
    with pytest.raises(NodeExecutionError, match=r"Conv: X has 3 channels, W \(4, 1, 3, 3\) with group=2"):
        ours(model, {"x": randn(rng, 1, 3, 5, 5)})
    pool = make([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[7, 7])], [vi("x", [1, 3, 5, 5])],
                [vi("y", None)], {}, 17)  # fmt: skip
    with pytest.raises(NodeExecutionError, match="MaxPool: a kernel of span"):
        ours(pool, {"x": randn(rng, 1, 3, 5, 5)})


# -- MaxUnpool, Col2Im, DeformConv ------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["numpy", "torch"])
def test_max_unpool_col2im_and_deform_conv(path: str, torch_session, rng) -> None:
    run = (lambda model, feed: ours(model, feed)) if path == "numpy" else (lambda m, f: torch_run(torch_session, m, f))
    x = randn(rng, 2, 3, 6, 7)
    pool = helper.make_node("MaxPool", ["x"], ["p", "i"], kernel_shape=[2, 2], strides=[2, 2])
    unpool = helper.make_node("MaxUnpool", ["p", "i", "shape"], ["u"], kernel_shape=[2, 2], strides=[2, 2])
    model = make([pool, unpool], [vi("x", [2, 3, 6, 7]), vi("shape", [4], TensorProto.INT64)], [vi("u", None)],
                 opset=22)  # fmt: skip
    feed = {"x": x, "shape": np.array([2, 3, 7, 8], np.int64)}  # larger than the pool's input
    same(run(model, feed), onnxruntime(model, feed), atol=0, rtol=0)
    for image, block, attrs in (([5, 6], [2, 3], {"pads": [1, 0, 0, 1], "strides": [2, 1]}),
                                ([4, 5, 3], [2, 2, 2], {"dilations": [1, 2, 1]})):  # fmt: skip
        node = helper.make_node("Col2Im", ["cols", "image", "block"], ["y"], **attrs)
        conv = helper.make_node("Conv", ["probe", "ones"], ["z"], **attrs)  # the number of blocks, from Conv
        probe = make([conv], [vi("probe", [1, 1, *image]), vi("ones", [1, 1, *block])], [vi("z", None)], opset=18)
        blocks = int(np.prod(onnxruntime(probe, {"probe": np.ones((1, 1, *image), np.float32),
                                                  "ones": np.ones((1, 1, *block), np.float32)})[0].shape))  # fmt: skip
        cols = randn(rng, 2, 3 * int(np.prod(block)), blocks)
        inputs = [vi("cols", list(cols.shape)), vi("image", [len(image)], TensorProto.INT64),
                  vi("block", [len(block)], TensorProto.INT64)]  # fmt: skip
        model = make([node], inputs, [vi("y", None)], opset=18)
        feed = {"cols": cols, "image": np.array(image, np.int64), "block": np.array(block, np.int64)}
        # onnxruntime's 3-D Col2Im with dilations disagrees with the spec's reference (and with ours)
        same(run(model, feed), (onnxruntime if len(image) == 2 else reference)(model, feed), atol=1e-5)
    offset = randn(rng, 2, 2 * 9 * 2, 6, 7) / 2
    mask = rng.random((2, 2 * 9, 6, 7)).astype(np.float32)
    node = helper.make_node("DeformConv", ["x", "w", "offset", "b", "mask"], ["y"], kernel_shape=[3, 3],
                            pads=[1, 1, 1, 1], offset_group=2)  # fmt: skip
    x = randn(rng, 2, 4, 6, 7)
    inputs = [vi("x", [2, 4, 6, 7]), vi("w", [4, 4, 3, 3]), vi("offset", list(offset.shape)), vi("b", [4]),
              vi("mask", list(mask.shape))]  # fmt: skip
    model = make([node], inputs, [vi("y", None)], opset=22)
    feed = {"x": x, "w": randn(rng, 4, 4, 3, 3), "offset": offset, "b": randn(rng, 4), "mask": mask}
    same(run(model, feed), onnxruntime(model, feed), atol=1e-4, rtol=1e-4)
    zero = {**feed, "offset": np.zeros_like(offset), "mask": np.ones_like(mask)}  # no offsets: a plain Conv
    conv = helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    plain = make([conv], inputs[:2] + inputs[3:4], [vi("y", None)], opset=22)
    same(run(model, zero), onnxruntime(plain, {k: zero[k] for k in ("x", "w", "b")}), atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
def test_a_small_cnn_on_cuda_with_cuda_graphs(rng) -> None:
    """Conv (cuDNN) + BatchNormalization + Relu + MaxPool + GlobalAveragePool + Gemm on the GPU, captured in a CUDA
    graph, against onnxruntime on the CPU (cuDNN may use TF32 for float32 convolutions: 1e-2)."""
    pytest.importorskip("torch")
    from xpuruntime.onnx import InferenceSession, SessionOptions

    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["n"]),
        helper.make_node("Relu", ["n"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["p"], ["a"]),
        helper.make_node("Flatten", ["a"], ["f"]),
        helper.make_node("Gemm", ["f", "fc"], ["y"], transB=1),
    ]
    consts = {"w": randn(rng, 16, 3, 3, 3) / 4, "g": randn(rng, 16), "b": randn(rng, 16), "m": randn(rng, 16),
              "v": (rng.random(16) + 0.5).astype(np.float32), "fc": randn(rng, 10, 16)}  # fmt: skip
    model = make(nodes, [vi("x", ["n", 3, 32, 32])], [vi("y", None)], consts, 17)
    session = InferenceSession(model.SerializeToString(), SessionOptions(enable_cuda_graph=True), device="cuda")
    for batch in (2, 4, 2):
        feed = {"x": randn(rng, batch, 3, 32, 32)}
        same(session.run(None, feed), onnxruntime(model, feed), atol=1e-2, rtol=1e-2)
    assert {entry.note for entry in session.runner.cache.values()} == {"CUDA graph captured"}
    assert "on the host" not in session.explain()


def _residual_block(rng):
    """Conv + Relu, Conv + the first's output as residual + Relu, a per-channel scale, pools and a Gemm."""
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "r1"], ["s"]),  # the residual: a convolution's output, as in ResNet
        helper.make_node("Relu", ["s"], ["r2"]),
        helper.make_node("Mul", ["r2", "scale"], ["m"]),  # a per-channel (C, 1, 1) operand, broadcast
        helper.make_node("MaxPool", ["m"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["p"], ["a"]),
        helper.make_node("Flatten", ["a"], ["f"]),
        helper.make_node("Gemm", ["f", "fc"], ["y"], transB=1),
    ]
    consts = {"w1": randn(rng, 8, 8, 3, 3) / 4, "b1": randn(rng, 8), "w2": randn(rng, 8, 8, 3, 3) / 4,
              "b2": randn(rng, 8), "scale": randn(rng, 8, 1, 1), "fc": randn(rng, 5, 8)}  # fmt: skip
    return make(nodes, [vi("x", ["n", 8, 9, 11])], [vi("y", None)], consts, 17)


@pytest.fixture
def channels_last_on_the_cpu(monkeypatch):
    """The GPU path's channels-last convolutions on CPU tensors (the CPU-only regions off)."""
    from xpuruntime.graph.passes import conv_regions

    monkeypatch.setattr(conv_module, "CHANNELS_LAST_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(conv_regions, "MIN_CONVS", 10**9)  # the CPU-only regions would take every convolution


def test_gpu_path_keeps_images_channels_last(rng, channels_last_on_the_cpu) -> None:
    """On the GPU path (CPU tensors here) a residual block's convolutions get channels-last weights, the residual
    Add + Relu (one fused elementwise kernel step) runs on NHWC views so its output stays channels-last, and the
    outputs still match onnxruntime at two batch sizes."""
    torch = pytest.importorskip("torch")
    from xpuruntime.dispatch import Dispatcher
    from xpuruntime.onnx import InferenceSession
    from xpuruntime.onnx.runners import gpu_runner_factory

    model = _residual_block(rng)
    session = InferenceSession(model.SerializeToString(), runner=gpu_runner_factory("cpu"),
                               dispatcher=Dispatcher(cpu_kernels_on_tensors("fused_elementwise/numpy_codegen")))  # fmt: skip
    for batch in (2, 3):
        feed = {"x": randn(rng, batch, 8, 9, 11)}
        same(session.run(None, feed), onnxruntime(model, feed), atol=1e-4, rtol=1e-4)
        steps = [(s.node.op, s.kind, s.nhwc) for s in session.runner.last_plan().steps]
        assert [op for op, _, nhwc in steps if nhwc] == ["fused_elementwise"], steps
    weights = {name: t for name, t in session.runner.constants.popitem()[1].items() if name.endswith("channels_last")}
    assert sorted(name.split("@")[0] for name in weights) == ["w1", "w2"]
    assert all(t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous() for t in weights.values())


def test_residual_add_and_relu_fuse_into_the_convolution_for_the_gpu(rng, channels_last_on_the_cpu, monkeypatch):
    """With the passes made for a CUDA session, the block's Conv + Add + Relu is one FusedConv with the residual as
    its fourth input Z (cuDNN's conv + bias + add + Relu on the GPU); run through the GPU path's functions and the
    NumPy path alike, it matches onnxruntime. A CPU session does not fuse it (its regions sum residuals themselves)."""
    pytest.importorskip("torch")
    from xpuruntime.onnx import InferenceSession
    from xpuruntime.onnx.runners import gpu_runner_factory

    model = _residual_block(rng)
    feed = {"x": randn(rng, 2, 8, 9, 11)}
    cpu_graph = InferenceSession(model.SerializeToString()).graph
    assert not [n for n in cpu_graph.nodes if n.op == "FusedConv" and len(n.inputs) == 4]
    optimize_as_cuda(monkeypatch)
    # Z from an input whose symbolic height and width are 1 at run time: fused (the names differ from the
    # output's, as an exporter's often do), then added by broadcasting
    conv = helper.make_node("Conv", ["x", "w1", "b1"], ["c"], pads=[1, 1, 1, 1])
    nodes = [conv, helper.make_node("Add", ["z", "c"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    inputs = [vi("x", ["n", 8, "h", "w"]), vi("z", ["n", 8, "zh", "zw"])]
    broadcast = make(nodes, inputs, [vi("y", None)], {"w1": randn(rng, 8, 8, 3, 3) / 4, "b1": randn(rng, 8)}, 17)
    broadcast_feed = {"x": randn(rng, 2, 8, 5, 6), "z": randn(rng, 2, 8, 1, 1)}
    for runner in (gpu_runner_factory("cpu"), None):
        for case, inputs in ((model, feed), (broadcast, broadcast_feed)):
            session = InferenceSession(case.SerializeToString(), runner=runner)
            fused = [n for n in session.graph.nodes if n.op == "FusedConv" and len(n.inputs) == 4]
            assert len(fused) == 1 and fused[0].inputs[3] and "Add" not in session.graph.op_counts()
            same(session.run(None, inputs), onnxruntime(case, inputs), atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_residual_block_on_cuda_runs_channels_last_and_fused(rng, dtype) -> None:
    """On CUDA the residual block's convolutions run channels-last, its Conv + Add + Relu as one FusedConv with Z
    (cuDNN's conv + bias + add + Relu), in a captured CUDA graph, against onnxruntime in float32 on the same
    (fp16-rounded, for fp16) weights and inputs (cuDNN's TF32 and fp16: 1e-2 and 3e-2)."""
    pytest.importorskip("torch")
    from xpuruntime.onnx import InferenceSession, SessionOptions

    reference_model, model = _in_dtype(_residual_block(rng), dtype)
    session = InferenceSession(model.SerializeToString(), SessionOptions(enable_cuda_graph=True), device="cuda")
    assert len([n for n in session.graph.nodes if n.op == "FusedConv" and len(n.inputs) == 4]) == 1
    tol = 1e-2 if dtype == "float32" else 3e-2
    for batch in (2, 5, 2):
        x = randn(rng, batch, 8, 9, 11).astype(dtype)
        (got,) = session.run(None, {"x": x})
        same([got.astype(np.float32)], onnxruntime(reference_model, {"x": x.astype(np.float32)}), atol=tol, rtol=tol)
    assert {entry.note for entry in session.runner.cache.values()} == {"CUDA graph captured"}


def _in_dtype(model, dtype: str) -> tuple:
    """(a float32 model with the weights rounded to `dtype`, the model in `dtype`: initializers, input, output)."""
    import onnx
    from onnx import numpy_helper

    rounded, typed = onnx.ModelProto(), onnx.ModelProto()
    rounded.CopyFrom(model)
    typed.CopyFrom(model)
    for i, init in enumerate(model.graph.initializer):
        values = numpy_helper.to_array(init).astype(dtype)
        rounded.graph.initializer[i].CopyFrom(numpy_helper.from_array(values.astype(np.float32), init.name))
        typed.graph.initializer[i].CopyFrom(numpy_helper.from_array(values, init.name))
    for value in (*typed.graph.input, *typed.graph.output):
        value.type.tensor_type.elem_type = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    return rounded, typed
