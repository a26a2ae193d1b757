"""onnxruntime's contract where users rely on it: providers (names, tuples with options, CPU fallback with a warning,
unknown names warned with a suggestion), SessionOptions that refuse unknown attributes and size the thread pools,
RunOptions, get_modelmeta / get_session_options / get_provider_options, and IOBinding."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import helper

from xpuruntime.errors import ArgumentError
from xpuruntime.onnx import InferenceSession, RunOptions, RunTerminatedError, SessionOptions
from xpuruntime.onnx.builtin import encoder_inputs, encoder_model
from xpuruntime.onnx.providers import ProviderFallbackWarning, cuda_available, get_available_providers
from xpuruntime.onnx.runners import CpuRunner

MODEL = encoder_model(layers=1, hidden=32, heads=2, ffn=64, vocab=50).SerializeToString()
FEED = encoder_inputs(2, 6, vocab=50)
no_cuda = pytest.mark.skipif(cuda_available(), reason="tests the fallback on a machine without CUDA")


@no_cuda
def test_cuda_provider_falls_back_to_cpu_with_a_warning() -> None:
    for providers in (["CUDAExecutionProvider", "CPUExecutionProvider"], [("CUDAExecutionProvider", {"device_id": 0})]):
        with pytest.warns(ProviderFallbackWarning, match="CUDAExecutionProvider is not available"):
            session = InferenceSession(MODEL, providers=providers)
        assert session.device == "cpu" and session.get_providers() == ["CPUExecutionProvider"]
        np.testing.assert_allclose(session.run(None, FEED)[0], InferenceSession(MODEL).run(None, FEED)[0])


def test_unknown_provider_is_warned_with_a_suggestion() -> None:
    with pytest.warns(ProviderFallbackWarning, match="did you mean 'CPUExecutionProvider'"):
        session = InferenceSession(MODEL, providers=["CPUExectionProvider"])
    assert session.get_providers() == ["CPUExecutionProvider"]
    assert get_available_providers()[-1] == "CPUExecutionProvider"


def test_quiet_sessions_and_malformed_providers() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # log_severity_level 3: errors only, as onnxruntime
        InferenceSession(MODEL, SessionOptions(log_severity_level=3), providers=["NoSuchProvider"])
    for bad in ("CPUExecutionProvider", [("CPUExecutionProvider", "not a dict")], [42]):
        with pytest.raises(ArgumentError, match="providers"):
            InferenceSession(MODEL, providers=bad)
    with pytest.raises(ArgumentError, match="provider_options"):
        InferenceSession(MODEL, providers=["CPUExecutionProvider"], provider_options=[{}, {}])


def test_provider_options_are_reported_as_strings() -> None:
    session = InferenceSession(MODEL, providers=[("CPUExecutionProvider", {"arena_extend_strategy": 1})])
    assert session.get_provider_options() == {"CPUExecutionProvider": {"arena_extend_strategy": "1"}}


def test_session_options_refuse_unknown_attributes_with_a_suggestion() -> None:
    options = SessionOptions()
    with pytest.raises(ArgumentError, match="did you mean 'intra_op_num_threads'"):
        options.intra_op_num_thread = 1
    with pytest.raises(ArgumentError, match="did you mean 'graph_optimization_level'"):
        options.graph_optimisation_level = 1
    with pytest.raises(TypeError, match="graph_optimisation_level"):  # a keyword of the constructor: Python's error
        SessionOptions(graph_optimisation_level=1)  # type: ignore[call-arg]
    for name, value in (("intra_op_num_threads", -1), ("inter_op_num_threads", 1.5), ("log_severity_level", 7)):
        setattr(options, name, value)
        with pytest.raises(ArgumentError, match=name):
            InferenceSession(MODEL, options)
        options = SessionOptions()
    with pytest.raises(ArgumentError, match="sess_options"):
        InferenceSession(MODEL, {"intra_op_num_threads": 1})  # type: ignore[arg-type]


def test_intra_op_threads_size_the_blas_pool_during_runs() -> None:
    threadpoolctl = pytest.importorskip("threadpoolctl")
    seen: list[int] = []

    class Spy(CpuRunner):
        def run(self, variant, feed):  # type: ignore[no-untyped-def]
            seen.extend(info["num_threads"] for info in threadpoolctl.threadpool_info() if info["user_api"] == "blas")
            return super().run(variant, feed)

    session = InferenceSession(MODEL, SessionOptions(intra_op_num_threads=1), runner=lambda *a: Spy(*a[:3]))
    before = [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]
    session.run(None, FEED)
    assert seen and set(seen) == {1}
    assert [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"] == before
    assert session.get_session_options().intra_op_num_threads == 1


def test_run_options() -> None:
    session = InferenceSession(MODEL)
    options = RunOptions(logid="mine")
    assert session.run(None, FEED, options)[0].shape == (2, 6, 32)
    with pytest.raises(ArgumentError, match="did you mean 'terminate'"):
        options.terminat = True
    options.terminate = True
    with pytest.raises(RunTerminatedError, match="terminate"):
        session.run(None, FEED, options)
    with pytest.raises(ArgumentError, match="run_options"):
        session.run(None, FEED, "garbage")  # type: ignore[arg-type]


def test_model_metadata() -> None:
    model = encoder_model(layers=1, hidden=32, heads=2, ffn=64, vocab=50)
    model.producer_name, model.domain, model.model_version, model.doc_string = "zoo", "ai.test", 7, "an encoder"
    helper.set_model_props(model, {"author": "xpuruntime"})
    meta = InferenceSession(model.SerializeToString()).get_modelmeta()
    assert (meta.producer_name, meta.domain, meta.version, meta.description) == ("zoo", "ai.test", 7, "an encoder")
    assert meta.graph_name == model.graph.name and meta.custom_metadata_map == {"author": "xpuruntime"}
    assert isinstance(model, onnx.ModelProto)


def test_io_binding_on_the_cpu_writes_into_bound_buffers() -> None:
    session = InferenceSession(MODEL)
    binding = session.io_binding()
    for name, array in FEED.items():
        binding.bind_cpu_input(name, array)
    out = np.full((2, 6, 32), np.nan, np.float32)
    name = session.get_outputs()[0].name
    binding.bind_output(name, "cpu", 0, np.float32, out.shape, out.ctypes.data)
    session.run_with_iobinding(binding)
    np.testing.assert_array_equal(out, session.run(None, FEED)[0])
    assert np.shares_memory(binding.get_outputs()[0], out)
    binding.bind_output(name, "cpu", 0, np.float32, (3, 6, 32), out.ctypes.data)
    with pytest.raises(ArgumentError, match="bound to shape"):
        session.run_with_iobinding(binding)
    with pytest.raises(ArgumentError, match="unknown input 'nope'"):
        binding.bind_cpu_input("nope", FEED["input_ids"])


@pytest.mark.gpu
def test_io_binding_on_the_gpu_keeps_everything_on_the_device() -> None:
    torch = pytest.importorskip("torch")
    session = InferenceSession(MODEL, providers=["CUDAExecutionProvider"])
    assert session.device == "cuda:0"
    binding = session.io_binding()
    inputs = {k: torch.from_numpy(v).cuda() for k, v in FEED.items()}
    for name, tensor in inputs.items():
        binding.bind_input(name, "cuda", 0, np.int64, tuple(tensor.shape), tensor.data_ptr())
    out = torch.full((2, 6, 32), float("nan"), device="cuda")
    binding.bind_output(session.get_outputs()[0].name, "cuda", 0, np.float32, tuple(out.shape), out.data_ptr())
    for _ in range(3):  # the first run plans and captures; later ones replay
        session.run_with_iobinding(binding)
    binding.synchronize_outputs()
    want = InferenceSession(MODEL).run(None, FEED)[0]
    np.testing.assert_allclose(out.cpu().numpy(), want, atol=1e-3)
    assert binding.get_outputs()[0].data_ptr() == out.data_ptr()
