"""ABI types, devices and sync policy."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_toy_registry

import xpuruntime as xrt
from xpuruntime.abi import ArgPack, LaunchConfig, MathMode, SyncPolicy, TensorSpec, layout_class
from xpuruntime.dispatch import Dispatcher
from xpuruntime.errors import PolicyError
from xpuruntime.policy import KernelPolicy
from xpuruntime.registry import Backend
from xpuruntime.runtime import device


def test_tensor_spec_strides_layout_and_size():
    spec = TensorSpec((2, 3, 4), "float16")
    assert spec.strides == (12, 4, 1) and spec.itemsize == 2 and spec.nbytes == 48 and spec.layout == "contiguous"
    assert layout_class((3, 4), (1, 3)) == "transposed"
    assert layout_class((3, 4), (8, 2)) == "strided"
    assert layout_class((1, 4), (99, 1)) == "contiguous"  # size-1 axes do not matter
    assert layout_class((0, 4), (7, 7)) == "contiguous"


def test_argpack_gives_the_packed_abi_view():
    a = np.arange(24, dtype=np.float32).reshape(4, 6)[:, 1::2]
    out = np.empty((4, 3), np.float32)
    pack = ArgPack((a, 2.0, None), out, {}, LaunchConfig(), np.empty(64, np.uint8), stream="s0")
    ta, scalar, absent, tout = pack.tensors()
    assert (ta.shape, ta.strides, ta.dtype, ta.device) == ((4, 3), (6, 2), "float32", "cpu")
    assert ta.ptr == a.__array_interface__["data"][0] and ta.layout == "strided"
    assert scalar is None and absent is None and tout.strides == (3, 1)
    assert pack.stream == "s0" and pack.workspace_bytes == 64


def test_enums_parse_names_case_insensitively():
    assert MathMode.parse("Mixed") is MathMode.MIXED and MathMode.for_dtype("bfloat16") is MathMode.BF16
    assert SyncPolicy.parse("FULL-SYNC") is SyncPolicy.FULL_SYNC
    with pytest.raises(PolicyError):
        SyncPolicy.parse("sometimes")
    assert LaunchConfig(grid=(2, 2), block=(64,), smem_bytes=128, params={"BM": 64}).describe() == (
        "grid=(2, 2) block=(64,) smem=128B BM=64"
    )


def test_math_mode_reaches_the_context():
    a = TensorSpec((2, 2), "float16")
    assert xrt.explain("matmul", a, a, show=False).ctx.math_mode is MathMode.FP16
    assert (
        xrt.explain("matmul", a, a, policy=KernelPolicy(math_mode="mixed"), show=False).ctx.math_mode is MathMode.MIXED
    )


def test_full_sync_policy_synchronizes_after_each_launch():
    registry = make_toy_registry({"name": "k"})
    synced = []
    registry.backends["cpu"] = Backend(
        "cpu", "cpu", empty=lambda s, d, dev, stream: np.empty(s, d), synchronize=lambda dev, stream: synced.append(dev)
    )
    dispatcher = Dispatcher(registry)
    dispatcher.run("toy", (np.ones(2),))
    assert synced == []
    with xrt.kernel_policy(sync="full_sync"):
        dispatcher.run("toy", (np.ones(2),))
        dispatcher.run("toy", (np.ones(2),))
    assert synced == ["cpu", "cpu"]


def test_devices_always_lists_the_cpu_first():
    found = xrt.devices()
    assert found[0].name == "cpu" and found[0].kind == "cpu" and found[0].multiprocessors >= 1
    assert device.compute_capability("cpu") is None
    assert all(isinstance(line, str) for line in device.probe_report())


def test_device_probe_survives_broken_libraries(monkeypatch):
    def broken():
        raise RuntimeError("driver version mismatch")

    monkeypatch.setattr(device, "_cuda_via_cuda_python", broken)
    monkeypatch.setattr(device, "_cuda_via_torch", lambda: (_ for _ in ()).throw(ImportError("no torch")))
    device._probe.cache_clear()
    try:
        assert [d.name for d in device.devices()] == ["cpu"]
        assert device.probe_report()[0] == "cuda-python: driver version mismatch"
        assert device.probe_report()[1].startswith("torch: not installed")
    finally:
        device._probe.cache_clear()


@pytest.mark.gpu
def test_cuda_devices_report_compute_capability_and_memory():
    gpus = [d for d in xrt.devices() if d.kind == "cuda"]
    assert gpus[0].compute_capability >= (7, 0) and gpus[0].multiprocessors > 0 and gpus[0].total_memory_bytes > 2**30
    assert device.compute_capability("cuda:0") == gpus[0].compute_capability
