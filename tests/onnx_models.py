"""Small ONNX models built by hand for the InferenceSession tests, how they are run (by us on the CPU, through
the GPU path's PyTorch functions with CPU tensors, by onnxruntime on the CPU and by the ONNX reference
evaluator), and how results are compared."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import numpy as np
import onnx
import onnxruntime as ort
from hypothesis import HealthCheck, settings
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from xpuruntime.onnx import InferenceSession, SessionOptions

LEVELS = ("disabled", "basic", "all")
PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
RNG = np.random.default_rng(20)  # for tests that take no `rng` fixture


def make(
    nodes: list, inputs: list, outputs: list, consts: dict | None = None, opset: int = 13, ir_version: int | None = None
) -> onnx.ModelProto:
    """A one-graph model; IR version 3 before opset 7 (what those opsets came with), else 8."""
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in (consts or {}).items()]
    graph = helper.make_graph(nodes, "t", inputs, outputs, inits)
    ir = ir_version if ir_version is not None else 3 if opset < 7 else 8
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir)


def vi(name: str, shape: list | None, dtype: int = onnx.TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def ours(model: onnx.ModelProto, feed: dict, level: str = "all") -> list[np.ndarray]:
    """Our session's outputs (fed copies: a run must not write into the caller's arrays)."""
    sess = InferenceSession(model.SerializeToString(), SessionOptions(graph_optimization_level=level))
    return sess.run(None, {k: v.copy() for k, v in feed.items()})


def onnxruntime(model: onnx.ModelProto, feed: dict) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.log_severity_level = 3  # e.g. "only guarantees support for opset 7 or above": expected for old opsets
    sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return sess.run(None, feed)


def cpu_kernels_on_tensors(*kernels: str):
    """A registry whose kernels are the CPU kernels named "op/name" on CPU tensors (a backend allocating tensors; the
    NumPy kernels compute on NumPy views of them), as the GPU path's Triton kernels run on CUDA tensors: kernel
    steps the GPU planner makes on the CPU."""
    import dataclasses

    import torch

    from xpuruntime.abi import ArgPack
    from xpuruntime.registry import Backend, Registry, default_registry

    registry, default = Registry(), default_registry()
    for schema in default.ops.values():
        registry.register_op(schema)
    registry.register_backend(Backend("tensors", "cpu", lambda shape, dtype, device, stream=None: torch.empty(
        tuple(shape), dtype=getattr(torch, str(dtype)))))  # fmt: skip
    numpy = lambda t: t.numpy() if isinstance(t, torch.Tensor) else t  # noqa: E731
    for qualified in kernels:
        cpu = default.kernel(*qualified.split("/"))

        def launch(args: ArgPack, cpu=cpu) -> None:
            arrays = tuple(map(numpy, args.inputs))
            cpu.launch(ArgPack(arrays, numpy(args.out), args.attrs, args.config, numpy(args.workspace), args.stream))

        registry.register_kernel(dataclasses.replace(cpu, name=f"{cpu.name}_on_tensors", backend="tensors",
                                                     launch=launch))  # fmt: skip
    return registry


def optimize_as_cuda(monkeypatch) -> None:
    """Sessions made from now on optimize their graphs as for a CUDA device (some fusions are made for GPU graphs
    only), whatever device they run on."""
    from xpuruntime.onnx import session as session_module

    real = session_module.optimize
    monkeypatch.setattr(session_module, "optimize", lambda graph, level, dispatcher, device, semantics: real(
        graph, level, dispatcher, "cuda", semantics))  # fmt: skip


def torch_path_builder():
    """build(model, level="all") -> a session whose runs go through the GPU path's PyTorch op map with CPU
    tensors (the GPU planner, no kernels of ours): the GPU path's semantics, testable without a GPU."""
    from xpuruntime.dispatch import Dispatcher
    from xpuruntime.onnx.runners import gpu_runner_factory
    from xpuruntime.registry import Registry, default_registry

    registry = Registry()
    for schema in default_registry().ops.values():
        registry.register_op(schema)
    dispatcher = Dispatcher(registry)

    def build(model: onnx.ModelProto, level: str = "all") -> InferenceSession:
        options = SessionOptions(graph_optimization_level=level, enable_cuda_graph=False)
        return InferenceSession(
            model.SerializeToString(), options, dispatcher=dispatcher, runner=gpu_runner_factory("cpu")
        )

    return build


HOST_READS = ("cpu", "numpy", "item", "tolist", "__bool__", "__int__", "__float__", "__index__")


@contextlib.contextmanager
def no_host_reads(monkeypatch) -> Iterator[None]:
    """As if a CUDA graph were being captured, without a GPU: the op records see `capturing()` true, and any read
    of a tensor's values on the host (what breaks a capture: .cpu(), .numpy(), .item(), int(t), bool(t), ...)
    raises AssertionError naming it."""
    import torch

    from xpuruntime.onnx.ops import record

    def refuse(name: str):
        def read(*args: object, **kwargs: object) -> None:
            raise AssertionError(f"a host read (Tensor.{name}) where a CUDA graph is being captured")

        return read

    with monkeypatch.context() as patch:
        patch.setattr(record, "capturing", lambda device: True)
        for name in HOST_READS:
            patch.setattr(torch.Tensor, name, refuse(name))
        yield


def torch_run(build, model: onnx.ModelProto, feed: dict) -> list[np.ndarray]:
    """Outputs through the GPU path's PyTorch functions (`build` from torch_path_builder); a warning fails
    (e.g. PyTorch's "The given NumPy array is not writable")."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return build(model).run(None, {k: v.copy() for k, v in feed.items()})


def run_on(path: str, build, model: onnx.ModelProto, feed: dict) -> list[np.ndarray]:
    """Outputs on the 'numpy' path (ours) or the 'torch' path (the GPU path's PyTorch functions)."""
    if path == "numpy":
        return ours(model, feed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build(model).run(None, {k: v.copy() for k, v in feed.items()})


def reference(model: onnx.ModelProto, feed: dict) -> list[np.ndarray]:
    """The ONNX reference evaluator (for what onnxruntime does not run)."""
    return ReferenceEvaluator(model).run(None, feed)


def session_at(model: onnx.ModelProto, level: str) -> InferenceSession:
    return InferenceSession(model.SerializeToString(), SessionOptions(graph_optimization_level=level))


def check_reference(sess: InferenceSession, model: onnx.ModelProto, feed: dict, rtol: float = 1e-5) -> None:
    """The session's outputs (fed copies) against the ONNX reference evaluator's."""
    want = reference(model, feed)
    got = sess.run(None, {k: v.copy() for k, v in feed.items()})
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, f"got {g.dtype}{g.shape}, expected {w.dtype}{w.shape}"
        np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-6)


def same(got: list, want: list, atol: float = 1e-5, rtol: float = 1e-5) -> None:
    """Same count, dtypes and shapes, values within tolerance."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        w = np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape, f"got {g.dtype}{g.shape}, expected {w.dtype}{w.shape}"
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def randn(rng: np.random.Generator, *shape: int, dtype: type = np.float32) -> np.ndarray:
    """Random values, never zero."""
    x = rng.standard_normal(shape) * 3
    return (x + np.where(x >= 0, 0.01, -0.01)).astype(dtype)
