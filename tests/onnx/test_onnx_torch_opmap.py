"""The GPU path's PyTorch op map and fallbacks, checked without a GPU: the ONNX node tests run through
the GPU planner with CPU tensors and a dispatcher that has no kernels, so every node takes the PyTorch
implementation the GPU uses when no kernel of ours fits."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")

from onnx.backend.test.loader import load_model_tests  # noqa: E402
from test_onnx_node_tests import KNOWN  # noqa: E402

from xpuruntime.dispatch import Dispatcher  # noqa: E402
from xpuruntime.onnx import InferenceSession, SessionOptions, UnsupportedModelError  # noqa: E402
from xpuruntime.onnx.backend import claims  # noqa: E402
from xpuruntime.onnx.builtin import encoder_inputs, encoder_model  # noqa: E402
from xpuruntime.onnx.runners import gpu_runner_factory  # noqa: E402
from xpuruntime.registry import Registry, default_registry  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    CASES = [c for c in load_model_tests(kind="node") if claims(c.model)]

_FFT_NOISE = (
    "the expected imaginary parts are NumPy's float32 FFT round-off (1.9e-7, above the case's atol 1e-7) where "
    "the exact value is 0; torch.fft rounds differently (the NumPy path, using NumPy's FFT, matches)"
)
KNOWN_TORCH = {**KNOWN, "test_dft_inverse": _FFT_NOISE, "test_dft_inverse_opset19": _FFT_NOISE}


@pytest.fixture(scope="module")
def no_kernels() -> Dispatcher:
    registry = Registry()
    for schema in default_registry().ops.values():
        registry.register_op(schema)
    return Dispatcher(registry)


def torch_session(model: object, level: str, dispatcher: Dispatcher) -> InferenceSession:
    options = SessionOptions(graph_optimization_level=level, enable_cuda_graph=False)
    return InferenceSession(model, options, dispatcher=dispatcher, runner=gpu_runner_factory("cpu"))


def _array(x: object) -> np.ndarray:
    return onnx.numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else np.asarray(x)


@pytest.mark.parametrize("level", ["disabled", "all"])
@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, marks=pytest.mark.xfail(reason=KNOWN_TORCH[c.name])) if c.name in KNOWN_TORCH else c
        for c in CASES
    ],
    ids=lambda c: c.name,
)
def test_node_torch(case: object, level: str, no_kernels: Dispatcher) -> None:
    try:
        session = torch_session(case.model, level, no_kernels)
    except UnsupportedModelError as exc:
        assert "uint" in str(exc)  # PyTorch lacks most ops on uint16/32/64: refused at load time, by design
        pytest.skip(str(exc))
    initializers = {i.name for i in case.model.graph.initializer}
    declared = [
        onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
        for i in case.model.graph.input
        if i.name not in initializers
    ]
    names = [i.name for i in session.get_inputs()]
    for inputs, outputs in case.data_sets:
        arrays = [_array(x) for x in inputs]
        arrays = [a.astype(d) if a.dtype == object else a for a, d in zip(arrays, declared)]
        got = session.run(None, dict(zip(names, arrays)))
        for g, e in zip(got, outputs):
            e = _array(e)
            assert g.dtype == e.dtype and g.shape == e.shape
            np.testing.assert_allclose(g, e, rtol=case.rtol, atol=case.atol, equal_nan=True)


def test_encoder_through_torch_path_matches_cpu(no_kernels: Dispatcher) -> None:
    data = encoder_model(layers=1, hidden=32, heads=2, ffn=64, vocab=50).SerializeToString()
    cpu = InferenceSession(data)
    session = torch_session(data, "all", no_kernels)
    for batch, seq in ((2, 7), (3, 4)):
        feed = encoder_inputs(batch, seq, vocab=50)
        want = cpu.run(None, feed)[0]
        np.testing.assert_allclose(session.run(None, feed)[0], want, rtol=1e-5, atol=1e-5)
        tensors = session.run(None, {k: torch.from_numpy(v) for k, v in feed.items()})[0]
        assert isinstance(tensors, torch.Tensor)
        np.testing.assert_allclose(tensors.numpy(), want, rtol=1e-5, atol=1e-5)
    assert "PyTorch fallback" in session.explain()
