"""cuBLASLt plans on many streams: a plan is shared by every stream, its scratch never is.

These tests run on any machine: nvmath-python is replaced by fake modules (a fake `Matmul` and a fake
`cublasLt.matmul` that records what each launch was given) and CUDA streams by objects that record
`wait_stream`. The GPU test at the end runs the same paths with nvmath on real CUDA streams.
"""

from __future__ import annotations

import sys
import threading
import types
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from xpuruntime.backends.cublaslt import common as lt  # noqa: E402
from xpuruntime.runtime.workspace import WorkspaceManager  # noqa: E402

NVMATH_WORKSPACE = 4096  # what the fake heuristic asks for


class FakeStream:
    """A CUDA stream stand-in: a raw handle and a record of the streams it was made to wait for."""

    def __init__(self, handle: int) -> None:
        self.cuda_stream = handle
        self.waited: list[FakeStream] = []

    def wait_stream(self, other: FakeStream) -> None:
        self.waited.append(other)

    def __repr__(self) -> str:
        return f"FakeStream({self.cuda_stream})"


class FakeMatmul:
    """The parts of nvmath's stateful Matmul that GemmPlan uses (row-major result of A @ B)."""

    def __init__(self, a: Any, b: Any, c: Any = None, beta: Any = None, options: Any = None, stream: Any = None):
        self.operands = [types.SimpleNamespace(data_ptr=a.data_ptr()), types.SimpleNamespace(data_ptr=b.data_ptr())]
        n = b.shape[1]
        self.result_traits = types.SimpleNamespace(result_shape=(a.shape[0], n), result_strides=(n, 1))
        self.handle, self.mm_desc = 101, 102
        self.alpha, self.beta = np.ones(1, np.float32), np.zeros(1, np.float32)
        self.a_layout_ptr, self.b_layout_ptr, self.c_layout_ptr, self.d_layout_ptr = 201, 202, 203, 204
        self.cached_best_algorithm_struct = np.zeros(64, np.uint8)
        self.mm_desc_ifc = types.SimpleNamespace()
        self.workspace = types.SimpleNamespace(size=NVMATH_WORKSPACE)
        self.executed: list[Any] = []
        self.freed = False

    def plan(self, **kwargs: Any) -> None:
        pass

    def release_operands(self) -> None:
        pass

    def reset_operands_unchecked(self, **kwargs: Any) -> None:
        pass

    def execute(self, stream: Any = None) -> Any:
        self.executed.append(stream)
        return None

    def free(self) -> None:
        self.freed = True


@pytest.fixture
def fake_nvmath(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """nvmath replaced by fakes; returns the list of raw cublasLt.matmul calls:
    (workspace pointer, workspace bytes, stream handle) each. Fallback scratch comes from a fresh manager
    and is allocated in CPU memory."""
    launches: list[tuple] = []

    def matmul(*args: Any) -> None:
        launches.append(args[-3:])

    nvmath = types.ModuleType("nvmath")
    linalg = types.ModuleType("nvmath.linalg")
    advanced = types.ModuleType("nvmath.linalg.advanced")
    bindings = types.ModuleType("nvmath.bindings")
    advanced.Matmul = FakeMatmul
    advanced.MatmulEpilog = types.SimpleNamespace(BIAS="BIAS", GELU_BIAS="GELU_BIAS")
    advanced.MatmulComputeType = types.SimpleNamespace(COMPUTE_32F="COMPUTE_32F")
    bindings.cublasLt = types.SimpleNamespace(matmul=matmul)
    nvmath.linalg, linalg.advanced, nvmath.bindings = linalg, advanced, bindings
    for name, module in (("nvmath", nvmath), ("nvmath.linalg", linalg), ("nvmath.linalg.advanced", advanced),
                         ("nvmath.bindings", bindings)):  # fmt: skip
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(lt, "FALLBACK_WORKSPACES", WorkspaceManager(), raising=False)
    cpu_empty = lambda shape, dtype, device, stream: torch.empty(shape, dtype=torch.uint8)  # noqa: E731
    monkeypatch.setattr(lt, "empty_on_stream", cpu_empty, raising=False)
    return launches


def _operands() -> tuple[Any, Any, Any]:
    return torch.randn(64, 32), torch.randn(32, 16), torch.empty(64, 16)


def _ranges_overlap(first: tuple, second: tuple) -> bool:
    (p, n), (q, m) = first, second
    return p < q + m and q < p + n


def test_raw_launches_lent_no_workspace_use_one_scratch_per_stream(fake_nvmath):
    a, b, c = _operands()
    plan = lt.GemmPlan(a, b, c, None, None, None, None)
    assert plan.raw and plan.workspace_size == NVMATH_WORKSPACE
    ptrs = (a.data_ptr(), b.data_ptr(), c.data_ptr())
    one, two = FakeStream(11), FakeStream(22)
    too_small = torch.empty(16, dtype=torch.uint8)
    plan.launch(*ptrs, stream=one)  # lent nothing
    plan.launch(*ptrs, stream=two)
    plan.launch(*ptrs, workspace=too_small, stream=two)  # lent too little
    plan.launch(*ptrs, workspace=too_small, stream=one)
    by_stream: dict[int, set] = {}
    for ptr, size, handle in fake_nvmath:
        assert ptr != 0 and size == NVMATH_WORKSPACE and ptr != too_small.data_ptr()
        by_stream.setdefault(handle, set()).add(ptr)
    assert set(by_stream) == {11, 22}
    assert all(len(ptrs_) == 1 for ptrs_ in by_stream.values()), "a stream's scratch is reused, not remade"
    (on_one,), (on_two,) = by_stream[11], by_stream[22]
    assert not _ranges_overlap((on_one, NVMATH_WORKSPACE), (on_two, NVMATH_WORKSPACE)), "two streams share scratch"


def test_raw_launch_prefers_the_lent_workspace(fake_nvmath):
    a, b, c = _operands()
    plan = lt.GemmPlan(a, b, c, None, None, None, None)
    lent = torch.empty(NVMATH_WORKSPACE, dtype=torch.uint8)
    plan.launch(a.data_ptr(), b.data_ptr(), c.data_ptr(), workspace=lent, stream=FakeStream(5))
    assert fake_nvmath == [(lent.data_ptr(), NVMATH_WORKSPACE, 5)]


def test_raw_plans_share_no_scratch_across_streams_from_threads(fake_nvmath):
    """Two threads, one plan, each thread on its own stream, no workspace lent."""
    a, b, c = _operands()
    plan = lt.GemmPlan(a, b, c, None, None, None, None)
    streams = [FakeStream(31), FakeStream(32)]
    start = threading.Barrier(2)

    def launch(stream: FakeStream) -> None:
        start.wait()
        for _ in range(20):
            plan.launch(a.data_ptr(), b.data_ptr(), c.data_ptr(), stream=stream)

    threads = [threading.Thread(target=launch, args=(s,)) for s in streams]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ptrs = {handle: {p for p, _, h in fake_nvmath if h == handle} for handle in (31, 32)}
    assert all(len(p) == 1 for p in ptrs.values())
    assert not _ranges_overlap((*ptrs[31], NVMATH_WORKSPACE), (*ptrs[32], NVMATH_WORKSPACE))


def test_nvmath_execute_on_a_new_stream_waits_for_the_previous_one(fake_nvmath):
    """nvmath's execute() keeps one workspace per Matmul: two streams must not run it at once."""
    a, b, c = _operands()
    plan = lt.GemmPlan(a, b, c, None, None, None, None, raw=False)
    assert not plan.raw
    one, two = FakeStream(1), FakeStream(2)
    plan.run(a, b, c, stream=one)
    plan.run(a, b, c, stream=one)
    assert one.waited == [] and two.waited == []  # one stream: ordered already
    plan.run(a, b, c, stream=two)
    assert two.waited == [one]
    plan.run(a, b, c, stream=two)
    assert two.waited == [one]
    plan.run(a, b, c, stream=one)
    assert one.waited == [two]
    assert plan.mm.executed == [one, one, two, two, one]


def test_freeing_an_nvmath_plan_orders_its_workspace_after_its_last_use(fake_nvmath):
    a, b, c = _operands()
    plan = lt.GemmPlan(a, b, c, None, None, None, None, raw=False)
    first, other = FakeStream(1), FakeStream(2)
    plan.run(a, b, c, stream=first)  # nvmath allocates its workspace on this stream
    plan.run(a, b, c, stream=other)
    plan.free()
    assert first.waited == [other] and plan.mm.freed


# -- on the GPU: the same paths with nvmath and real streams ---------------------------------------------------
def _cublaslt_ready() -> None:
    from xpuruntime.backends.cublaslt import BACKEND

    if BACKEND.unavailable_reason:
        pytest.skip(BACKEND.unavailable_reason)


@pytest.mark.gpu
@pytest.mark.parametrize("raw", [True, False])
def test_plan_on_two_streams_without_lent_workspace_is_right(raw, monkeypatch):
    """One plan, two streams, no workspace lent: each stream gets its own scratch (raw launches) or waits
    for the other (nvmath's execute), and every product is right."""
    _cublaslt_ready()
    lent: list[tuple[int, int]] = []
    real = lt.fallback_workspace

    def spy(nbytes: int, device: str, stream: Any) -> Any:
        buffer = real(nbytes, device, stream)
        lent.append((buffer.data_ptr(), int(stream.cuda_stream)))
        return buffer

    monkeypatch.setattr(lt, "fallback_workspace", spy)
    dev = "cuda"
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    bs = [torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16) / 64 for _ in range(2)]
    outs = [torch.empty(4096, 4096, device=dev, dtype=torch.bfloat16) for _ in range(2)]
    plan = lt.GemmPlan(a, bs[0], outs[0], None, None, None, torch.cuda.current_stream(), raw=raw)
    streams = [torch.cuda.Stream() for _ in range(2)]
    torch.cuda.synchronize()
    for _ in range(5):
        for stream, b, out in zip(streams, bs, outs):
            with torch.cuda.stream(stream):
                plan.run(a, b, out, workspace=None, stream=stream)
    torch.cuda.synchronize()
    for b, out in zip(bs, outs):
        ref = (a.float() @ b.float()).to(torch.bfloat16).float()
        err = (out.float() - ref).norm() / ref.norm()
        assert err < 1e-2
    if raw and plan.workspace_size:
        assert {h for _, h in lent} == {int(s.cuda_stream) for s in streams}
        assert len({p for p, _ in lent}) == 2, lent
    plan.free()
