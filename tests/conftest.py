"""Shared fixtures: every test starts with no policy, no logging and no profiler, and GPU tests skip
cleanly on machines without a CUDA device."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import settings

import xpuruntime as xrt
from xpuruntime import log, policy
from xpuruntime.abi import TensorSpec
from xpuruntime.context import DispatchContext
from xpuruntime.registry import Backend, Registry, kernel
from xpuruntime.schema import OpSchema

# CI replays the same examples on every run, so a submission's result does not depend on luck; runs
# elsewhere draw fresh examples (and may find new failures, each printed with its reproducer).
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from xpuruntime.runtime.device import devices

    if any(d.kind == "cuda" for d in devices()):
        return
    skip = pytest.mark.skip(reason="no CUDA device on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng() -> np.random.Generator:
    """Fresh random data per test (tests must not depend on one lucky draw)."""
    return np.random.default_rng()


@pytest.fixture(scope="session")
def torch_session():
    """A session builder through the ONNX GPU path's PyTorch functions, with CPU tensors (onnx_models)."""
    pytest.importorskip("torch")
    from onnx_models import torch_path_builder

    return torch_path_builder()


@pytest.fixture(autouse=True)
def clean_runtime_state(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(policy.ENV_POLICY, raising=False)
    monkeypatch.delenv(policy.ENV_POLICY_FILE, raising=False)
    xrt.clear_kernel_policy()
    policy.forget_environment()  # the environment is read again, lazily, at the test's first dispatch
    yield
    xrt.clear_kernel_policy()
    xrt.disable_dispatch_logging()
    xrt.clear_dispatch_logs()
    assert not log.OBSERVERS, "a test left an observer (profiler / logging) active"


def make_toy_registry(*kernels_spec: dict) -> Registry:
    """A registry with one op 'toy' (y = x) on a 'cpu' backend and the given kernels.

    Each kernel dict holds `name` plus any KernelSpec hint; every kernel writes its own index + x into
    the output, so a test can see which kernel ran.
    """
    registry = Registry()
    registry.register_op(
        OpSchema(
            name="toy",
            inputs=("x",),
            infer_dtype=lambda ctx: ctx.tensor("x").dtype,
            infer_shape=lambda ctx: ctx.tensor("x").shape,
            reference=lambda x: np.asarray(x, np.float64),
        )
    )
    registry.register_backend(Backend("cpu", "cpu", empty=lambda shape, dtype, device, stream: np.empty(shape, dtype)))
    for index, spec in enumerate(kernels_spec):
        hints = dict(spec)
        name = hints.pop("name")
        hints.setdefault("backend", "cpu")

        def launch(args, index=index) -> None:
            np.add(args.inputs[0], index, out=args.out)

        registry.register_kernel(kernel("toy", name, **hints)(launch))
    return registry


def toy_context(registry: Registry, dtype: str = "float32", shape=(4, 4), **overrides) -> DispatchContext:
    """A hand-made context for the toy op (lets tests set compute capability, device, determinism)."""
    fields = dict(op="toy", arg_names=("x",), inputs=(TensorSpec(shape, dtype),), attrs={}, out_shape=shape,
                  out_dtype=dtype)  # fmt: skip
    fields.update(overrides)
    return DispatchContext(**fields)
